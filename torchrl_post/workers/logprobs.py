"""Per-token logprobs and entropy of the response part of [prompt | response] sequences."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.multimodal.vision import NEVER_GENERATED_BIAS, VisionSpec, model_inputs
from torchrl_post.types import Batch


def logits_to_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, never: tuple[int, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, V], labels [B, T] -> (log p(label) [B, T], entropy [B, T]), at `temperature`.

    Temperature 0 (greedy) uses the raw logits, as the rollout engine reports them. `never`: token ids whose
    logits get NEVER_GENERATED_BIAS first, as the engines bias them (a vision model's placeholders).
    """
    logits = logits.float()
    if never:
        logits = logits.clone()
        logits[..., list(never)] += NEVER_GENERATED_BIAS
    if temperature > 0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def response_log_probs(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], response_width: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward the model once on `inputs` (`model_inputs`); logprob and entropy of each response token, [B, R]."""
    out = model(**inputs, use_cache=False)
    # The token at column P + t is predicted by the logits at column P + t - 1.
    logits = out.logits[:, -response_width - 1 : -1]
    return logits_to_logprobs(logits, inputs["input_ids"][:, -response_width:], temperature, _never(model))


def _never(model: torch.nn.Module) -> tuple[int, ...]:
    """Token ids the engines never generate (a vision model's placeholders): their logits are biased alike."""
    spec = VisionSpec.of(getattr(model, "config", None))
    return spec.never_generated if spec is not None else ()


def chunks(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most `size` rows covering range(n)."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


@torch.no_grad()
def batched_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    micro: int,
    device: torch.device,
    token_budget: int = 0,
    packed: bool = False,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Logprobs of every response token of a Batch under `model`, [B, R], on CPU (micro-batches as
    `plan_micro_batches`; `group`: the FSDP ranks that must run as many forwards)."""
    model.eval()
    packed = packed and can_pack(batch)
    out = torch.zeros(batch.loss_mask.shape)
    plan = plan_micro_batches(batch.attention_mask, batch.response_width, micro, token_budget, packed, group, device)
    for mb in plan:
        logp = forward_log_probs(model, batch, mb, temperature, device, packed)[0]
        if mb.live:
            out[mb.rows] = logp.float().cpu()
    return out


def trim_span(attention_mask: torch.Tensor, response_width: int) -> tuple[int, int]:
    """(first column, response columns kept) after dropping padding shared by every row of a micro-batch.

    Prompts are left-padded and responses right-padded, so the columns before the earliest prompt token and
    after the longest response carry nothing. At least one response column is kept.
    """
    prompt_width = attention_mask.shape[1] - response_width
    real_cols = attention_mask.any(0).nonzero()
    first = int(real_cols[0].item()) if len(real_cols) else 0
    last = int(real_cols[-1].item()) if len(real_cols) else prompt_width
    return min(first, prompt_width - 1), max(1, last + 1 - prompt_width)


def micro_slices(attention_mask: torch.Tensor, response_width: int, max_rows: int, token_budget: int) -> list[slice]:
    """Contiguous micro-batches of at most `max_rows` rows, or, with `token_budget` > 0 (dynamic batch size),
    as many rows as fit rows x trimmed width <= token_budget (at least one row each)."""
    n = attention_mask.shape[0]
    if token_budget <= 0:
        return list(chunks(n, max_rows))
    prompt_width = attention_mask.shape[1] - response_width
    firsts = torch.where(attention_mask.any(1), attention_mask.float().argmax(1), prompt_width - 1)
    lasts = attention_mask.shape[1] - 1 - attention_mask.flip(1).float().argmax(1)
    out: list[slice] = []
    start, lo, hi = 0, 0, 0
    for i in range(n):
        f, last = int(firsts[i]), max(int(lasts[i]), prompt_width)
        if i == start:
            lo, hi = f, last
        elif (i - start + 1) * (max(hi, last) - min(lo, f) + 1) > token_budget:
            out.append(slice(start, i))
            start, lo, hi = i, f, last
        else:
            lo, hi = min(lo, f), max(hi, last)
    if start < n:
        out.append(slice(start, n))
    return out


def padded_forward_log_probs(
    model: torch.nn.Module, batch: Batch, rows: slice | torch.Tensor, temperature: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """response_log_probs of `rows` on their trimmed span, padded back to [b, R]; also the cells computed."""
    width = batch.response_width
    mask = batch.attention_mask[rows]
    first, kept = trim_span(mask, width)
    end = mask.shape[1] - width + kept
    logp, ent = response_log_probs(model, model_inputs(batch, rows, first, end, device), kept, temperature)
    pad = width - kept
    if pad:
        logp = torch.nn.functional.pad(logp, (0, pad))
        ent = torch.nn.functional.pad(ent, (0, pad))
    return logp, ent, mask.shape[0] * (end - first)


# ---- micro-batches: padded rows, or packed (verl's use_remove_padding) -----------------------------------


@dataclass(frozen=True)
class MicroBatch:
    """Rows of a (mini-)batch forwarded together. `live=False`: a stand-in that only keeps this rank's FSDP
    collectives in step with ranks that have more micro-batches (its loss is multiplied by zero)."""

    rows: slice | torch.Tensor
    live: bool = True


def pack_rows(lengths: list[int], budget: int) -> list[list[int]]:
    """First-fit decreasing: row indices into packs of at most `budget` tokens (a longer row alone)."""
    packs: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for p, free in enumerate(room):
            if lengths[i] <= free:
                packs[p].append(i)
                room[p] -= lengths[i]
                break
        else:
            packs.append([i])
            room.append(budget - lengths[i])
    return [sorted(p) for p in packs]


def balance_rows(lengths: list[int], k: int) -> list[list[int]]:
    """Row indices into exactly `k` bins of about equal token sums (longest first into the lightest bin);
    bins stay empty when there are fewer rows than bins."""
    bins: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        b = min(range(k), key=lambda j: (load[j], j))
        bins[b].append(i)
        load[b] += lengths[i]
    return [sorted(b) for b in bins]


def _aligned(count: int, group: dist.ProcessGroup | None, device: torch.device | None) -> int:
    """The largest micro-batch count over `group` (FSDP ranks must run the same number of forwards)."""
    if group is None:
        return count
    return int(reduce_metrics({"micro_batches": ("max", float(count))}, group, device)["micro_batches"])


def plan_micro_batches(
    attention_mask: torch.Tensor,
    response_width: int,
    max_rows: int,
    token_budget: int,
    packed: bool,
    group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
) -> list[MicroBatch]:
    """This rank's micro-batches of a batch, the same number on every rank of `group` (agreed on `device`).

    Fixed size (`token_budget` 0): `max_rows` consecutive rows each, padded or packed. Dynamic
    (`token_budget` > 0): padded, as many consecutive rows as fit rows x trimmed width; packed, the rows
    balanced into as many packs as the rank that needs the most needs (first-fit decreasing of real tokens
    into the budget), so every pack holds about the same number of tokens. Ranks short of micro-batches
    run stand-ins (`live=False`).
    """
    if token_budget <= 0:
        return [MicroBatch(sl) for sl in chunks(attention_mask.shape[0], max_rows)]
    if packed:
        lengths = attention_mask.sum(1).tolist()
        k = _aligned(len(pack_rows(lengths, token_budget)), group, device)
        bins = balance_rows(lengths, k)
        return [MicroBatch(torch.tensor(b)) if b else MicroBatch(torch.tensor([0]), live=False) for b in bins]
    out = [MicroBatch(sl) for sl in micro_slices(attention_mask, response_width, max_rows, token_budget)]
    k = _aligned(len(out), group, device)
    return out + [MicroBatch(slice(0, 1), live=False)] * (k - len(out))


@dataclass(frozen=True)
class Pack:
    """Samples' real tokens packed into k rows of equal length T (first-fit, each row as long as the longest
    sample, so attention per row costs no more than a padded row's; right-aligned, see `pack`). `ids`, `pos` [k, T]; `keep` [K]: the
    columns whose outputs predict (or value) a response token in some row; `out_row`, `out_col`, `out_kept`
    [N]: for each of the N response tokens, its predicting position's row, column, and index in `keep`;
    `labels` [N]; `valid_bt` [b, R]: where those N outputs go back."""

    ids: torch.Tensor
    pos: torch.Tensor
    keep: torch.Tensor
    out_row: torch.Tensor
    out_col: torch.Tensor
    out_kept: torch.Tensor
    labels: torch.Tensor
    valid_bt: torch.Tensor
    tokens: int
    """Real tokens packed (the rest of the k x T cells is each row's tail)."""

    @property
    def cells(self) -> int:
        return self.ids.numel()

    def inputs(self, device: torch.device) -> dict[str, Any]:
        """The forward's keyword arguments: no attention mask, so HF's models read the restarts of the
        position ids as sample boundaries (a block-diagonal causal mask per row; varlen attention with
        flash-attn). Not with a KV cache (HF then reads them as one sequence): `use_cache=False`."""
        return {"input_ids": self.ids.to(device), "position_ids": self.pos.to(device), "use_cache": False}

    def kept(self, out: torch.Tensor) -> torch.Tensor:
        """[k, K, ...] outputs at `keep` (logits_to_keep) -> [N, ...], one per response token."""
        return out[self.out_row.to(out.device), self.out_kept.to(out.device)]

    def full(self, out: torch.Tensor) -> torch.Tensor:
        """[k, T, ...] outputs at every column -> [N, ...], one per response token."""
        return out[self.out_row.to(out.device), self.out_col.to(out.device)]

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """[N] per response token -> [b, R], zero elsewhere (differentiable)."""
        if not self.valid_bt.any():  # nothing to score: one kept position holds the graph together
            return torch.zeros(self.valid_bt.shape, device=values.device, dtype=values.dtype) + 0.0 * values.sum()
        where = tuple(w.to(values.device) for w in self.valid_bt.nonzero(as_tuple=True))
        return torch.zeros(self.valid_bt.shape, device=values.device, dtype=values.dtype).index_put(where, values)


def pack(batch: Batch, rows: slice | torch.Tensor) -> Pack:
    """The real tokens of `rows` (left-padded prompt, then the response right after it) in rows as long as the
    longest sample, each sample with its own position ids 0, 1, ... Rows are right-aligned, the sample with the
    longest response last: most responses then end in the same last columns, and the LM head (one set of
    columns for every row, `logits_to_keep`) runs over few columns. A row's leading slack is a run of positions of
    its own, which no real token attends to."""
    mask = batch.attention_mask[rows].bool()
    ids_b, pos_b = batch.input_ids[rows], batch.position_ids[rows]
    width = batch.response_width
    lengths = mask.sum(1).tolist()
    resp = mask[:, -width:].sum(1).tolist()
    cap = max(max(lengths), 1)
    bins = pack_rows(lengths, cap)
    ids = torch.zeros(len(bins), cap, dtype=ids_b.dtype)
    pos = torch.zeros(len(bins), cap, dtype=pos_b.dtype)
    where_row = torch.zeros(mask.shape[0], width, dtype=torch.long)
    where_col = torch.zeros(mask.shape[0], width, dtype=torch.long)
    for r, members in enumerate(bins):
        members = sorted(members, key=lambda i: (resp[i], i))  # the longest response ends the row
        col = cap - sum(lengths[i] for i in members)
        if col:  # slack: a run of positions the first sample restarts from, its first token repeated
            first_id, first_pos = ids_b[members[0]][mask[members[0]]][0], pos_b[members[0]][mask[members[0]]][0]
            ids[r, :col] = first_id
            pos[r, :col] = first_pos + 1 + torch.arange(col)
        for i in members:
            n = lengths[i]
            ids[r, col : col + n], pos[r, col : col + n] = ids_b[i][mask[i]], pos_b[i][mask[i]]
            where_row[i] = r
            where_col[i] = col + n - resp[i] + torch.arange(width)  # response token t of sample i
            col += n
    valid_bt = torch.arange(width) < torch.tensor(resp).unsqueeze(1)
    out_row, target = where_row[valid_bt], where_col[valid_bt]
    if not len(target):  # nothing to score: one position keeps the graph (and FSDP's backward) together
        out_row, target = torch.zeros(1, dtype=torch.long), torch.full((1,), cap - 1, dtype=torch.long)
    out_col = target - 1 if valid_bt.any() else target
    keep, out_kept = torch.unique(out_col, sorted=True, return_inverse=True)
    return Pack(ids, pos, keep, out_row, out_col, out_kept, ids[out_row, target], valid_bt, sum(lengths))


def packed_forward_log_probs(
    model: torch.nn.Module, batch: Batch, rows: slice | torch.Tensor, temperature: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """response_log_probs of `rows` packed without padding (`pack`), [b, R]; also the token cells computed.
    Only the columns that predict response tokens go through the LM head (`logits_to_keep`)."""
    p = pack(batch, rows)
    out = model(**p.inputs(device), logits_to_keep=p.keep.to(device))
    logp, ent = logits_to_logprobs(p.kept(out.logits), p.labels.to(device), temperature, _never(model))
    return p.unpack(logp), p.unpack(ent).detach(), p.cells


def can_pack(batch: Batch) -> bool:
    """Packing needs one row of position ids per sample: a vision model's M-RoPE positions and images do not
    pack here (verl and OpenRLHF do not pack VLM batches either)."""
    return not batch.has_images and batch.position_ids.dim() == 2


def forward_log_probs(
    model: torch.nn.Module, batch: Batch, micro: MicroBatch, temperature: float, device: torch.device, packed: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The micro-batch's response logprobs and entropy [b, R] and the token cells computed; `packed` only
    where `can_pack(batch)`."""
    if packed:
        return packed_forward_log_probs(model, batch, micro.rows, temperature, device)
    return padded_forward_log_probs(model, batch, micro.rows, temperature, device)
