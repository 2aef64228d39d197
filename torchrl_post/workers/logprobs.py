"""Per-token logprobs and entropy of the response part of [prompt | response] sequences.

Every function takes an optional `truncation` (the run plan's `sampling_support`): the logprobs are then
renormalised on the sampler's top-k / top-p kept set (`algos/sampling_support.py`), as the engine's are; the
entropy is always the full distribution's (a property of the policy, not of the sampler).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from torchrl_post.algos.sampling_support import Truncation, support_log_probs
from torchrl_post.distributed.ulysses import sum_over
from torchrl_post.multimodal.vision import NEVER_GENERATED_BIAS, VisionSpec, model_inputs
from torchrl_post.types import Batch, pad_columns
from torchrl_post.workers.lm_head import chunked_log_probs, chunked_top_k
from torchrl_post.workers.micro_batches import MicroBatch, plan_micro_batches, trim_span
from torchrl_post.workers.moe import RouteTrace, routing
from torchrl_post.workers.packing import can_pack, packed_inputs
from torchrl_post.workers.ulysses import SequenceShard, sequence_parallel


def logits_to_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    never: tuple[int, ...] = (),
    truncation: Truncation | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, V], labels [B, T] -> (log p(label) [B, T], entropy [B, T]), at `temperature`; labels
    [B, T, j] give log p of each, [B, T, j] (`chunked_log_probs`' several labels).

    Temperature 0 (greedy) uses the raw logits, as the rollout engine reports them. `never`: token ids whose
    logits get NEVER_GENERATED_BIAS first, as the engines bias them (a vision model's placeholders).
    `truncation`: log p(label) over the top-k / top-p kept set (`support_log_probs`; of several labels, the first);
    the entropy stays full.
    """
    logits = _scaled(logits, temperature, never)
    logp_all = torch.log_softmax(logits, dim=-1)
    several = labels.dim() == logits.dim()
    idx = labels if several else labels.unsqueeze(-1)
    logp = logp_all.gather(-1, idx)
    if truncation is not None:
        first = support_log_probs(logits, truncation, idx[..., 0]).gather(-1, idx[..., :1])
        logp = torch.cat([first, logp[..., 1:]], -1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return (logp if several else logp.squeeze(-1)), entropy


def _scaled(logits: torch.Tensor, temperature: float, never: tuple[int, ...]) -> torch.Tensor:
    """The float32 logits the sampler sees: `never` ids biased, divided by the temperature (0: greedy, unscaled)."""
    logits = logits.float()
    if never:
        logits = logits.clone()
        logits[..., list(never)] += NEVER_GENERATED_BIAS
    return logits / temperature if temperature > 0 else logits


def logits_top_k(logits: torch.Tensor, k: int, temperature: float, never: tuple[int, ...] = ()) -> torch.Tensor:
    """logits [..., V] -> the k most likely tokens at `temperature`, [..., k, 2]: (log p, token id as float32;
    exact, ids are below 2^24), most likely first (`chunked_top_k` from hidden states)."""
    top, ids = torch.log_softmax(_scaled(logits, temperature, never), dim=-1).topk(k, dim=-1)
    return torch.stack([top, ids.float()], dim=-1)


HEAD_CHUNK_TOKENS = 1024
"""Positions per pass of the chunked LM head (`workers/lm_head.py`) at most: its peak is about three [chunk x
vocabulary] float32 tensors, whatever the micro-batch. 0 computes a micro-batch's logits at once
(`logits_to_logprobs`), the path a head that is more than one linear layer takes (a soft cap or scale on the
logits)."""

HEAD_CHUNK_BYTES = 64 << 20
"""At most this many bytes in one [chunk x vocabulary] float32 tensor: 1024 positions of Qwen's 151,936-token
vocabulary are 0.62 GB apiece (1.9 GB at the head's peak, what a 4-sample step at 384 response tokens measured
above one at 64); 64 MiB is 110 positions of it, 512 of a 32k vocabulary, still large matrix products."""


HEAD_KEEP_BYTES = 512 << 20
"""At most this many bytes of the chunked head's logits kept from its forward for its backward (float32 [positions x
vocabulary]), which then skips their recomputation: a quarter of the head's matrix work on the kept positions
(SmolLM2's 49,152-token vocabulary: 2,730 positions, a whole micro-batch of the GSM8K benchmark; Qwen's
151,936: 883). Counted by the memory plan (`memory_plan.loss_path_bytes`)."""


def head_keep_positions(vocab: int, chunk: int) -> int:
    """The positions whose logits the chunked head keeps for its backward: whole chunks within HEAD_KEEP_BYTES."""
    return 0 if chunk <= 0 else HEAD_KEEP_BYTES // (4 * vocab) // chunk * chunk


def head_chunk_positions(vocab: int, most: int | None = None) -> int:
    """Positions per chunked head pass for a `vocab`-wide head: `most` (default HEAD_CHUNK_TOKENS) bounded by
    HEAD_CHUNK_BYTES; 0 stays 0 (the full logits)."""
    most = HEAD_CHUNK_TOKENS if most is None else most
    return 0 if most <= 0 else max(1, min(most, HEAD_CHUNK_BYTES // (4 * vocab)))


def _linear_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's LM head when the logits are exactly `head(hidden)` (what the chunked pass recomputes)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    if not isinstance(head, torch.nn.Linear) or type(head) is not torch.nn.Linear:
        return None  # an adapted head (PEFT's LoRA layer) or another kind: its forward is not a plain matmul
    if getattr(text, "final_logit_softcapping", None) or getattr(text, "logit_scale", None):
        return None
    return head


@contextmanager
def _head_forward(head: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """The head's forward replaced for one model call: it runs inside the model's forward, where FSDP has
    gathered the root's parameters (the head's weight among them) and mixed precision has cast them."""
    head.forward = forward  # type: ignore[method-assign]  # an instance attribute shadows the class's method
    try:
        yield
    finally:
        del head.forward


@dataclass(frozen=True)
class Routes:
    """The MoE routing of one forward: its input cells [b, T] that hold a token (`real`), the experts the engine
    recorded for them ([b, T, L, k], -1 where none), whether the routers replay them (else they choose and the
    record is only compared with), and where what the routers did goes (`trace`, or None)."""

    real: torch.Tensor
    recorded: torch.Tensor | None
    replay: bool
    trace: RouteTrace | None


@dataclass(frozen=True)
class MoeForward:
    """What a forward does with a MoE model's routers: `replay` the batch's recorded experts
    (actor.router_replay), and `trace` what they did (for the load-balancing loss and the disagreement)."""

    replay: bool = False
    trace: RouteTrace | None = None


def cell_routes(
    batch: Batch, rows: slice | torch.Tensor, source: torch.Tensor, moe: MoeForward | None
) -> Routes | None:
    """`Routes` of a forward whose input cell [i, j] is cell `source[i, j]` of the rows' [b, P + R] grid,
    flattened (-1: none: padding, a packed row's slack)."""
    if moe is None or (not moe.replay and moe.trace is None):
        return None
    real = source >= 0
    recorded = None
    if batch.routed_experts is not None:
        grid = batch.routed_experts[rows]  # [b, L, k, P + R]
        flat = grid.permute(0, 3, 1, 2).reshape(-1, *grid.shape[1:3])
        recorded = torch.where(real[..., None, None], flat[source.clamp(min=0)], -1)
    return Routes(real, recorded, moe.replay and recorded is not None, moe.trace)


@contextmanager
def _routed(
    model: torch.nn.Module, routes: Routes | None, device: torch.device, shard: SequenceShard | None = None
) -> Iterator[None]:
    """The model's routers as `routes` says for one call (this rank's columns of them under Ulysses)."""
    if routes is None:
        yield
        return
    real, recorded = routes.real.long(), routes.recorded
    if shard is not None and shard.size > 1:
        real = shard.local(real, 1)
        recorded = None if recorded is None else shard.local(recorded, 1, -1)
    flat = None if recorded is None else recorded.reshape(-1, *recorded.shape[2:]).to(device)
    with routing(model, routes.trace, flat if routes.replay else None, real.reshape(-1).bool().to(device), flat):
        yield


def _scores(
    top_k: int,
    labels: torch.Tensor,
    temperature: float,
    never: tuple[int, ...],
    truncation: Truncation | None,
    head: torch.nn.Linear | None,
) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """What the head computes for the N selected positions: [N, H] hidden states (`head`: the chunked pass) or
    [N, V] logits -> (values, entropy [N]). Values: log p of each label, [N] or [N, j]; or with `top_k` the k
    most likely tokens, [N, k, 2] (log p, id), and no entropy (zeros: a frozen teacher's forward)."""

    def scores(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if head is None and top_k:
            return logits_top_k(x, top_k, temperature, never), x.new_zeros(len(x), dtype=torch.float32)
        if head is None:
            return logits_to_logprobs(x, labels, temperature, never, truncation)
        chunk = head_chunk_positions(head.out_features)
        # the weight read here, inside the model's forward: FSDP has swapped in the gathered parameter
        if top_k:
            lp, ids = chunked_top_k(x, head.weight, head.bias, top_k, temperature, never, NEVER_GENERATED_BIAS, chunk)
            return torch.stack([lp, ids.float()], dim=-1), x.new_zeros(len(x), dtype=torch.float32)
        keep = head_keep_positions(head.out_features, chunk)
        return chunked_log_probs(
            x, head.weight, head.bias, labels, temperature, never, NEVER_GENERATED_BIAS, chunk, truncation, keep
        )

    return scores


def _through_head(
    head: torch.nn.Linear, scores: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]:
    """The head's stand-in forward (`scores` of the hidden states, as one [N, m + 1] tensor the model returns as
    its logits) and the split of that tensor back into (values, entropy)."""
    shape: list[torch.Size] = []

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        values, ent = scores(hidden)
        shape.append(values.shape)
        return torch.cat([values.reshape(len(ent), -1), ent[:, None]], dim=-1)

    def split(both: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return both[..., :-1].reshape(shape[-1]), both[..., -1]

    return forward, split


def head_log_probs(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    keep: torch.Tensor,
    select: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    temperature: float,
    shard: SequenceShard | None = None,
    routes: Routes | None = None,
    truncation: Truncation | None = None,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward `model` once on `inputs`; log p(label) and entropy [N] of the N positions that `select` takes
    ([b, K, ...] -> [N, ...]) from the `keep` columns (`logits_to_keep`); labels [N, j]: log p of each, [N, j];
    `top_k`: the k most likely tokens instead, [N, k, 2] (log p, id), entropy zero. The head runs chunked from
    the hidden states (`chunked_log_probs`) where it is a plain linear layer, else on the kept columns' full
    logits. With a sequence `shard` (Ulysses, sp > 1) this rank runs its columns and the group sums the N
    results. `routes`: the MoE routers' replay and trace for the call; `truncation`: log p(label) (the first of
    several) on the sampler's kept set."""
    if shard is not None and shard.size > 1:
        return _sharded_head_log_probs(
            model, inputs, keep, select, labels, temperature, shard, routes, truncation, top_k
        )
    never = _never(model)
    head = _linear_head(model) if HEAD_CHUNK_TOKENS > 0 else None
    scores = _scores(top_k, labels, temperature, never, truncation, head)
    if head is None:
        with _routed(model, routes, keep.device):
            out = model(**inputs, logits_to_keep=keep)
        return scores(select(out.logits))
    forward, split = _through_head(head, lambda hidden: scores(select(hidden)))
    with _head_forward(head, forward), _routed(model, routes, keep.device):
        return split(model(**inputs, logits_to_keep=keep).logits)


def _sharded_head_log_probs(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    keep: torch.Tensor,
    select: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    temperature: float,
    shard: SequenceShard,
    routes: Routes | None = None,
    truncation: Truncation | None = None,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`head_log_probs` over this rank's contiguous columns of every row: the head runs on the N positions whose
    predicting column is this rank's only (none twice in the group), the results of the others are zero here,
    and `sum_over` the sp group gives every rank all N (and, backward, each rank's gradient of the whole)."""
    b, k = inputs["input_ids"].shape[0], keep.numel()
    device = keep.device
    flat = select(torch.arange(b * k, device=device).view(b, k))  # [N]: each output's (row, kept column)
    row, col = flat // k, keep[flat % k]
    start, end = shard.span(shard.pad_to(inputs["input_ids"].shape[1]))
    local_keep = keep[(keep >= start) & (keep < end)] - start
    owned = ((col >= start) & (col < end)).nonzero().squeeze(-1)
    slot = torch.zeros(end - start, dtype=torch.long, device=device)
    slot[local_keep] = torch.arange(len(local_keep), device=device)
    at_row, at_slot, at_label = row[owned], slot[col[owned] - start], labels[owned]
    empty = not len(owned)
    if empty:  # nothing of this rank's is scored: one position keeps its graph (and FSDP's backward) together
        local_keep = at_row = at_slot = torch.zeros(1, dtype=torch.long, device=device)
        at_label = torch.zeros((1, *labels.shape[1:]), dtype=torch.long, device=device)
    never = _never(model)
    head = _linear_head(model) if HEAD_CHUNK_TOKENS > 0 else None
    scores = _scores(top_k, at_label, temperature, never, truncation, head)
    with sequence_parallel(model, shard, inputs) as local, _routed(model, routes, device, shard):
        if head is None:
            logits = model(**local, logits_to_keep=local_keep).logits
            logp, ent = scores(logits[at_row, at_slot])
        else:
            forward, split = _through_head(head, lambda hidden: scores(hidden[at_row, at_slot]))
            with _head_forward(head, forward):
                logp, ent = split(model(**local, logits_to_keep=local_keep).logits)
    n = labels.shape[0]
    anchor = 0.0 * (logp.sum() + ent.sum()) if empty else None  # the stand-in position: a zero term only
    if empty:
        logp, ent = logp[:0], ent[:0]
    full_logp = torch.zeros((n, *logp.shape[1:]), dtype=logp.dtype, device=device).index_put((owned,), logp)
    full_ent = torch.zeros(n, dtype=ent.dtype, device=device).index_put((owned,), ent)
    if anchor is not None:
        full_logp, full_ent = full_logp + anchor, full_ent + anchor
    return sum_over(full_logp, shard.group), sum_over(full_ent, shard.group)


def response_log_probs(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    response_width: int,
    temperature: float,
    shard: SequenceShard | None = None,
    routes: Routes | None = None,
    truncation: Truncation | None = None,
    score: Score | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward the model once on `inputs` (`model_inputs`); logprob and entropy of each response token, [B, R]
    (what `score` says: [B, R, 1 + j] or [B, R, k, 2]). Only the R columns that predict response tokens go
    through the LM head."""
    ids = inputs["input_ids"]
    b, t = ids.shape
    # The token at column P + t is predicted by the hidden state at column P + t - 1.
    keep = torch.arange(t - response_width - 1, t - 1, device=ids.device)
    labels = ids[:, -response_width:].reshape(-1)
    if score is not None and score.labels is not None:
        labels = torch.cat([labels[:, None], score.labels.reshape(len(labels), -1).to(labels.device)], dim=-1)
    logp, ent = head_log_probs(
        model, inputs, keep, lambda x: x.reshape(b * response_width, *x.shape[2:]), labels, temperature, shard,
        routes, truncation, score.top_k if score is not None else 0,
    )  # fmt: skip
    return logp.view(b, response_width, *logp.shape[1:]), ent.view(b, response_width)


def _never(model: torch.nn.Module) -> tuple[int, ...]:
    """Token ids the engines never generate (a vision model's placeholders): their logits are biased alike."""
    spec = VisionSpec.of(getattr(model, "config", None))
    return spec.never_generated if spec is not None else ()


@dataclass(frozen=True)
class Score:
    """What a forward scores at each response position beyond the sampled token's log p: `labels`, the batch's
    [B, R, j] token ids (the distillation teacher's top-k: the student's log p of each, out [b, R, 1 + j], the
    sampled token's first); or the `top_k` most likely tokens instead (a teacher's: out [b, R, k, 2], log p and
    id)."""

    labels: torch.Tensor | None = None
    top_k: int = 0

    def rows(self, rows: slice | torch.Tensor) -> Score:
        return replace(self, labels=self.labels[rows] if self.labels is not None else None)

    def width(self) -> tuple[int, ...]:
        """The trailing shape of a forward's [B, R, ...] output."""
        if self.top_k:
            return (self.top_k, 2)
        return (1 + self.labels.shape[-1],) if self.labels is not None else ()


def _score_rows(score: Score | None, rows: slice | torch.Tensor) -> Score | None:
    return score.rows(rows) if score is not None else None


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
    shared: bool = False,
    shard: SequenceShard | None = None,
    replay: bool = False,
    truncation: Truncation | None = None,
    score: Score | None = None,
) -> torch.Tensor:
    """Logprobs of every response token of a Batch under `model`, [B, R], on CPU (micro-batches as
    `plan_micro_batches`; `group`: the FSDP ranks that must run as many forwards; `replay`: a MoE model's routers
    use the batch's recorded experts; `truncation`: renormalised on the sampler's top-k / top-p kept set;
    `score`: more than the sampled token's, [B, R, ...])."""
    model.eval()
    packed = packed and can_pack(batch)
    out = torch.zeros(*batch.loss_mask.shape, *(score.width() if score is not None else ()))
    plan = plan_micro_batches(
        batch.attention_mask, batch.response_width, micro, token_budget, packed, group, device,
        prompts=batch.input_ids if shared else None,
    )  # fmt: skip
    for mb in plan:
        moe = MoeForward(replay=True) if replay else None
        logp = forward_log_probs(model, batch, mb, temperature, device, packed, shared, shard, moe, truncation, score)[
            0
        ]
        if mb.live:
            out[mb.rows] = logp.float().cpu()
    return out


def padded_forward_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    rows: slice | torch.Tensor,
    temperature: float,
    device: torch.device,
    shard: SequenceShard | None = None,
    moe: MoeForward | None = None,
    truncation: Truncation | None = None,
    score: Score | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """response_log_probs of `rows` on their trimmed span, padded back to [b, R]; also the cells computed and the
    real tokens among them."""
    width = batch.response_width
    mask = batch.attention_mask[rows]
    first, kept = trim_span(mask, width)
    end = mask.shape[1] - width + kept
    cells = torch.arange(mask.numel()).view(mask.shape)[:, first:end]
    routes = cell_routes(batch, rows, torch.where(mask[:, first:end].bool(), cells, -1), moe)
    inputs = model_inputs(batch, rows, first, end, device)
    mine = _score_rows(score, rows)
    if mine is not None and mine.labels is not None:
        mine = replace(mine, labels=mine.labels[:, :kept])
    logp, ent = response_log_probs(model, inputs, kept, temperature, shard, routes, truncation, mine)
    pad = width - kept
    return pad_columns(logp, pad), pad_columns(ent, pad), mask.shape[0] * (end - first), int(mask.sum())


# ---- micro-batches: padded rows, or packed (verl's use_remove_padding) -----------------------------------


def packed_forward_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    rows: slice | torch.Tensor,
    temperature: float,
    device: torch.device,
    shared: bool = False,
    shard: SequenceShard | None = None,
    moe: MoeForward | None = None,
    truncation: Truncation | None = None,
    score: Score | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """response_log_probs of `rows` packed without padding (`pack`), [b, R]; also the token cells computed and
    the real tokens among them. Only the columns that predict response tokens go through the LM head
    (`logits_to_keep`)."""
    p, inputs = packed_inputs(model, batch, rows, device, shared, shard)
    routes = cell_routes(batch, rows, p.source, moe)
    labels = p.labels
    if score is not None and score.labels is not None:  # the N response tokens run row-major over valid_bt
        labels = torch.cat([labels[:, None], score.labels[rows][p.valid_bt]], dim=-1)
    logp, ent = head_log_probs(
        model, inputs, p.keep.to(device), p.kept, labels.to(device), temperature, shard, routes, truncation,
        score.top_k if score is not None else 0,
    )  # fmt: skip
    return p.unpack(logp), p.unpack(ent), p.cells, p.tokens


def forward_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    micro: MicroBatch,
    temperature: float,
    device: torch.device,
    packed: bool,
    shared: bool = False,
    shard: SequenceShard | None = None,
    moe: MoeForward | None = None,
    truncation: Truncation | None = None,
    score: Score | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The micro-batch's response logprobs and entropy [b, R], the token cells computed and the real tokens
    among them; `packed` only where `can_pack(batch)`, `shared`: packed with each prompt once for the samples
    that share it; `shard`: this rank's part of each row (Ulysses), every rank of its group getting the whole;
    `moe`: what a MoE model's routers do (replay the batch's recorded experts, record what they chose);
    `truncation`: the logprobs renormalised on the sampler's top-k / top-p kept set (the plan's sampling_support);
    `score`: more than the sampled token's log p at each position ([b, R, ...]: `Score`)."""
    if packed:
        return packed_forward_log_probs(
            model, batch, micro.rows, temperature, device, shared, shard, moe, truncation, score
        )
    return padded_forward_log_probs(model, batch, micro.rows, temperature, device, shard, moe, truncation, score)
