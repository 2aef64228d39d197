"""The data contracts that cross stages: prompts -> generations -> one `Batch` that the whole step fills in.

Tensors keep verl's layout: prompts left-padded to a common width P, responses right-padded to R, so
`input_ids = [prompt | response]` is [B, P + R] and response token t sits at column P + t.
Samples are prompt-major: the n samples of prompt i are rows i*n .. i*n + n - 1, and `group_ids` names the
prompt (its position in the step's global batch).

A `Batch` is born in the rollout source (tokens, masks, rollout logprobs, termination, scores) and each
later stage adds its tensors (old/ref logprobs, values, advantages, returns). What crosses a process
boundary is `Batch.to_wire()` of a batch's groups (`split_groups`), and `Batch.concat` joins them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

TERMINATIONS = ("stop", "length", "env_done", "max_turns", "max_prompt_length", "timeout", "error")
"""Why a sample ended: `stop` (EOS or a stop token), `length` (data.max_response_length), and for agent
episodes `env_done`, `max_turns`, `max_prompt_length` (the context filled up), `timeout`, `error`."""


def termination_codes(reasons: list[str]) -> torch.Tensor:
    """Reason names -> int64 codes (indices into TERMINATIONS)."""
    unknown = sorted(set(reasons) - set(TERMINATIONS))
    if unknown:
        raise ValueError(f"unknown termination reasons {unknown}; expected one of {', '.join(TERMINATIONS)}")
    return torch.tensor([TERMINATIONS.index(r) for r in reasons], dtype=torch.long)


@dataclass
class PromptBatch:
    """This rank's prompts for one step (or one validation chunk)."""

    prompt_ids: list[list[int]]
    answers: list[Any]
    data_sources: list[str]
    extra_infos: list[dict[str, Any]]
    uids: list[int]
    """Position of each prompt in the global step batch: the group id of its samples."""
    questions: list[str] = field(default_factory=list)
    """The last user message of each prompt's row (an agent environment's task); empty where not kept."""
    images: list[list[Any]] = field(default_factory=list)
    """Vision-language models: each prompt's images (PIL); empty for text-only models."""
    mm_inputs: list[dict[str, Any]] = field(default_factory=list)
    """Each prompt's image processor outputs (pixel_values, image_grid_thw); {} for a prompt without images."""
    messages: list[list[dict[str, Any]]] = field(default_factory=list)
    """Each prompt's chat messages, text only (what a reward model re-tokenises); empty where not kept."""

    def __len__(self) -> int:
        return len(self.prompt_ids)


@dataclass
class Generation:
    """What a rollout engine returns, one entry per sample (prompt-major)."""

    response_ids: list[list[int]]
    logprobs: list[list[float]]
    """The engine's logprob of each generated token (after temperature)."""
    finish_reasons: list[str]
    """A name from TERMINATIONS: engines give `stop` or `length`."""
    routed_experts: list[torch.Tensor] | None = None
    """Mixture-of-experts models, when asked (`engines/vllm.py`): each sample's experts, int16
    [prompt + response - 1, MoE layers, top-k]: the row of position t is what routed token t (the last token
    routes nothing the sample needs); -1 where the engine computed no row (a prompt token served from its
    prefix cache)."""


# Which fields have which layout (the serialiser and `concat` pad and cut by these).
SEQUENCE_FIELDS = ("input_ids", "attention_mask", "position_ids")  # [B, P + R] ([B, 3, P + R]: M-RoPE positions)
TOKEN_FIELDS = (
    "loss_mask",
    "rollout_log_probs",
    "behavior_versions",
    "old_log_probs",
    "ref_log_probs",
    "teacher_log_probs",
    "teacher_topk",
    "values",
    "advantages",
    "returns",
)
SAMPLE_FIELDS = (  # [B]
    "group_ids",
    "termination",
    "weights",
    "scores",
    "reward_errors",
    "turns",
    "tool_calls",
    "tool_errors",
    "traj_ids",
    "step_ids",
    "step_rewards",
    "rm_scores",
    "judge_scores",
)
OWN_TOKEN_FIELDS = ("reward_inputs",)  # [B, L]: another tokenizer's ids, right-padded with -1
ROUTE_FIELDS = ("routed_experts",)  # [B, L, k, P + R]: optional, padded with -1 (no record)
IMAGE_FIELDS = ("image_counts", "image_grid_thw", "pixel_values")  # rows' images, concatenated in row order


@dataclass
class Batch:
    """Every sample of one step on this rank, with named fields; later stages fill in the optional ones."""

    input_ids: torch.Tensor  # [B, P+R] long
    attention_mask: torch.Tensor  # [B, P+R] long: every real token, prompt, response and observations
    position_ids: torch.Tensor  # [B, P+R] long
    loss_mask: torch.Tensor  # [B, R] float: the response tokens trained on (observation tokens are 0)
    rollout_log_probs: torch.Tensor  # [B, R] the engine's logprobs (the behaviour policy)
    group_ids: torch.Tensor  # [B] long
    termination: torch.Tensor  # [B] long, an index into TERMINATIONS
    weights: torch.Tensor  # [B] float: 1 trains, 0 is filtered out (leaves every loss denominator)
    scores: torch.Tensor | None = None  # [B] sequence reward
    reward_errors: torch.Tensor | None = None  # [B] 1.0 where the reward function failed (scored 0)
    reward_extra: dict[str, torch.Tensor] = field(default_factory=dict)  # [B] each; NaN where not given
    turns: torch.Tensor | None = None  # [B] agent turns of each sample's trajectory (agent loop only)
    tool_calls: torch.Tensor | None = None  # [B] tool calls of the trajectory (agent loop only)
    tool_errors: torch.Tensor | None = None  # [B] failed tool calls of the trajectory
    traj_ids: torch.Tensor | None = None  # [B] long: the trajectory of a step-wise row (-1: padding row)
    step_ids: torch.Tensor | None = None  # [B] long: the step's index in its trajectory (step-wise rows)
    step_rewards: torch.Tensor | None = None  # [B] the step's own reward (step-wise rows)
    # [B, L] long: the reward model's tokens of each sample's conversation (reward/model_inputs.py), right-padded
    # with -1; set by the rollout source when a reward model scores (reward_model.enable)
    reward_inputs: torch.Tensor | None = None
    rm_scores: torch.Tensor | None = None  # [B] the reward model's score of each sample
    judge_scores: torch.Tensor | None = None  # [B] the judge's score of each training sample (reward.judge)
    # [B, R] long: the policy version (the update whose weights sampled it) of each response token; -1 where none
    # (observation tokens, padding). Set by every rollout producer; read by the behaviour-version metrics.
    behavior_versions: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None  # [B, R]; None on-policy (the update's own detached logprobs)
    ref_log_probs: torch.Tensor | None = None  # [B, R]
    teacher_log_probs: torch.Tensor | None = None  # [B, R] the distillation teacher's logprobs of the sampled tokens
    # [B, R, k, 2] float32: the distillation teacher's k most likely tokens at each response position (its top-k,
    # distillation.loss_mode=forward_kl_topk): [..., 0] their log p, [..., 1] their ids (exact in float32: < 2^24)
    teacher_topk: torch.Tensor | None = None
    values: torch.Tensor | None = None  # [B, R]
    advantages: torch.Tensor | None = None  # [B, R]
    returns: torch.Tensor | None = None  # [B, R]
    # Vision-language models: every image of every row, in row order (a prompt's images repeat in each of its
    # samples). `position_ids` is then [B, 3, P+R]: the (temporal, height, width) M-RoPE positions.
    # Mixture-of-experts models with routing replay: the experts the engine chose for each token, [B, L, k, P+R]
    # int16 (MoE layers, top-k, then the columns, so that column slicing and padding treat it as a sequence);
    # -1 where nothing was recorded (padding, a prefix-cache hit): the trainer's router chooses there.
    routed_experts: torch.Tensor | None = None
    image_counts: torch.Tensor | None = None  # [B] long: images of each row
    image_grid_thw: torch.Tensor | None = None  # [I, 3] long: each image's patch grid, rows' images in order
    pixel_values: torch.Tensor | None = None  # [N, D]: each image's patches (grid t*h*w rows), images in order

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_width(self) -> int:
        return self.loss_mask.shape[1]

    @property
    def prompt_width(self) -> int:
        return self.input_ids.shape[1] - self.response_width

    @property
    def responses(self) -> torch.Tensor:
        return self.input_ids[:, -self.response_width :]

    @property
    def response_mask(self) -> torch.Tensor:
        """[B, R] float: every real token of the response part (generated and observed)."""
        return self.attention_mask[:, self.prompt_width :].float()

    @property
    def train_mask(self) -> torch.Tensor:
        """[B, R] loss_mask * weight: what the losses and their denominators count."""
        return self.loss_mask * self.weights.unsqueeze(-1)

    @property
    def termination_names(self) -> list[str]:
        return [TERMINATIONS[i] for i in self.termination.tolist()]

    @property
    def has_images(self) -> bool:
        return self.image_counts is not None

    def _image_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(image indices, patch indices) of `rows`, in row order."""
        assert self.image_counts is not None and self.image_grid_thw is not None
        img_start = torch.cumsum(self.image_counts, 0) - self.image_counts
        images = [
            torch.arange(s, s + c)
            for s, c in zip(img_start[rows].tolist(), self.image_counts[rows].tolist(), strict=True)
        ]
        img = torch.cat(images) if images else torch.zeros(0, dtype=torch.long)
        sizes = self.image_grid_thw.prod(-1)
        patch_start = torch.cumsum(sizes, 0) - sizes
        patches = [torch.arange(s, s + n) for s, n in zip(patch_start[img].tolist(), sizes[img].tolist(), strict=True)]
        return img, torch.cat(patches) if patches else torch.zeros(0, dtype=torch.long)

    def select(self, idx: torch.Tensor | slice) -> Batch:
        """The rows `idx` of every field (and their images)."""
        picked: dict[str, Any] = {}
        if self.image_counts is not None:
            assert self.image_grid_thw is not None and self.pixel_values is not None
            rows = torch.arange(len(self))[idx]
            img, patches = self._image_rows(rows.reshape(-1))
            picked["image_grid_thw"] = self.image_grid_thw[img]
            picked["pixel_values"] = self.pixel_values[patches]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in picked:
                continue
            if f.name == "reward_extra":
                picked[f.name] = {k: v[idx] for k, v in value.items()}
            else:
                picked[f.name] = None if value is None else value[idx]
        return replace(self, **picked)

    def trimmed(self) -> Batch:
        """Without the prompt columns that are padding in every row and the response columns past the
        longest response (at least one response column stays)."""
        real = self.attention_mask.any(0)
        p = self.prompt_width
        prompt_real = real[:p].nonzero()
        first = int(prompt_real[0].item()) if len(prompt_real) else p - 1
        resp_real = real[p:].nonzero()
        keep = max(1, int(resp_real[-1].item()) + 1 if len(resp_real) else 1)
        return self._slice_columns(first, keep)

    def _slice_columns(self, first: int, keep: int) -> Batch:
        p = self.prompt_width
        out: dict[str, Any] = {}
        for name in SEQUENCE_FIELDS:
            out[name] = getattr(self, name)[..., first : p + keep]
        for name in ROUTE_FIELDS:
            value = getattr(self, name)
            out[name] = None if value is None else value[..., first : p + keep]
        for name in TOKEN_FIELDS:
            value = getattr(self, name)
            out[name] = None if value is None else value[:, :keep]
        return replace(self, **out)

    def split_groups(self) -> dict[int, Batch]:
        """group id -> that group's rows (in order), trimmed: the unit that moves between ranks."""
        out = {}
        for g in self.group_ids.unique().tolist():
            out[int(g)] = self.select((self.group_ids == g).nonzero().flatten()).trimmed()
        return out

    @staticmethod
    def concat(parts: list[Batch], pad_id: int) -> Batch:
        """Rows of several batches in order: prompts left-padded, responses right-padded to the widest."""
        p_width = max(b.prompt_width for b in parts)
        r_width = max(b.response_width for b in parts)
        out: dict[str, Any] = {}
        for name in SEQUENCE_FIELDS:
            fill = pad_id if name == "input_ids" else 0
            out[name] = torch.cat([_pad_sequence(getattr(b, name), b, p_width, r_width, fill, name) for b in parts])
        for name in ROUTE_FIELDS:
            values = [getattr(b, name) for b in parts]
            out[name] = (
                None
                if any(v is None for v in values)
                else torch.cat(
                    [_pad_sequence(v, b, p_width, r_width, -1, name) for v, b in zip(values, parts, strict=True)]
                )
            )
        for name in TOKEN_FIELDS:
            values = [getattr(b, name) for b in parts]
            if any(v is None for v in values):
                out[name] = None
                continue
            out[name] = torch.cat([pad_columns(v, r_width - v.shape[1]) for v in values])
        for name in (*SAMPLE_FIELDS, *IMAGE_FIELDS):
            values = [getattr(b, name) for b in parts]
            out[name] = None if any(v is None for v in values) else torch.cat(values)
        for name in OWN_TOKEN_FIELDS:
            values = [getattr(b, name) for b in parts]
            width = max((v.shape[1] for v in values if v is not None), default=0)
            out[name] = (
                None
                if any(v is None for v in values)
                else torch.cat([torch.nn.functional.pad(v, (0, width - v.shape[1]), value=-1) for v in values])
            )
        keys = set(parts[0].reward_extra)
        if any(set(b.reward_extra) != keys for b in parts):  # a key one part lacks is NaN there
            keys = set().union(*(b.reward_extra for b in parts))
        out["reward_extra"] = {
            k: torch.cat([b.reward_extra.get(k, torch.full((len(b),), float("nan"))) for b in parts]) for k in keys
        }
        return Batch(**out)

    def to_wire(self) -> dict[str, torch.Tensor]:
        """Named tensors only (no pickled classes): what `route` and the role links send. Each is a copy:
        a pickled view would carry its whole storage, e.g. every padded column `trimmed` dropped."""
        wire = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "reward_extra"}
        wire |= {f"reward_extra/{k}": v for k, v in self.reward_extra.items()}
        return {k: v.clone() for k, v in wire.items() if v is not None}

    @staticmethod
    def from_wire(wire: dict[str, torch.Tensor]) -> Batch:
        extra = {k.removeprefix("reward_extra/"): v for k, v in wire.items() if k.startswith("reward_extra/")}
        known = {f.name for f in fields(Batch)}
        unknown = sorted(k for k in wire if k not in known and not k.startswith("reward_extra/"))
        if unknown:  # both sides run the same code; this is a protocol error
            raise RuntimeError(f"batch wire format has unknown fields {unknown}")
        return Batch(**{k: v for k, v in wire.items() if k in known}, reward_extra=extra)


def pad_columns(t: torch.Tensor, pad: int) -> torch.Tensor:
    """[B, R, ...] -> [B, R + pad, ...], zeros after (a per-token field, any trailing shape)."""
    return torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) if pad else t


def _pad_sequence(t: torch.Tensor, b: Batch, p_width: int, r_width: int, fill: int, name: str) -> torch.Tensor:
    """[b, P_b + R_b] -> [b, p_width + r_width]: left-pad the prompt part, right-pad the response part.

    Position ids continue the last position into the right padding (as `collate` makes them)."""
    left = p_width - b.prompt_width
    right = r_width - b.response_width
    out = torch.nn.functional.pad(t, (left, 0), value=fill)
    if right == 0:
        return out
    if name == "position_ids":
        return torch.cat([out, out[..., -1:].expand(*out.shape[:-1], right)], dim=-1)
    return torch.nn.functional.pad(out, (0, right), value=fill)
