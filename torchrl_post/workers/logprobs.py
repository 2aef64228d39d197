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
    shared: bool = False,
) -> torch.Tensor:
    """Logprobs of every response token of a Batch under `model`, [B, R], on CPU (micro-batches as
    `plan_micro_batches`; `group`: the FSDP ranks that must run as many forwards)."""
    model.eval()
    packed = packed and can_pack(batch)
    out = torch.zeros(batch.loss_mask.shape)
    plan = plan_micro_batches(
        batch.attention_mask, batch.response_width, micro, token_budget, packed, group, device,
        prompts=batch.input_ids if shared else None,
    )  # fmt: skip
    for mb in plan:
        logp = forward_log_probs(model, batch, mb, temperature, device, packed, shared)[0]
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
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """response_log_probs of `rows` on their trimmed span, padded back to [b, R]; also the cells computed and the
    real tokens among them."""
    width = batch.response_width
    mask = batch.attention_mask[rows]
    first, kept = trim_span(mask, width)
    end = mask.shape[1] - width + kept
    logp, ent = response_log_probs(model, model_inputs(batch, rows, first, end, device), kept, temperature)
    pad = width - kept
    if pad:
        logp = torch.nn.functional.pad(logp, (0, pad))
        ent = torch.nn.functional.pad(ent, (0, pad))
    return logp, ent, mask.shape[0] * (end - first), int(mask.sum())


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
    prompts: torch.Tensor | None = None,
) -> list[MicroBatch]:
    """This rank's micro-batches of a batch, the same number on every rank of `group` (agreed on `device`).

    Fixed size (`token_budget` 0): `max_rows` consecutive rows each, padded or packed. Dynamic
    (`token_budget` > 0): padded, as many consecutive rows as fit rows x trimmed width; packed, the rows
    balanced into as many packs as the rank that needs the most needs (first-fit decreasing of real tokens
    into the budget), so every pack holds about the same number of tokens; with `prompts` (the input ids: packed
    with shared prompts) the samples of a prompt stay together, counted with their prompt once. Ranks short of
    micro-batches run stand-ins (`live=False`).
    """
    if token_budget <= 0:
        return [MicroBatch(sl) for sl in chunks(attention_mask.shape[0], max_rows)]
    if packed:
        units, sizes = _prompt_units(attention_mask, response_width, prompts, token_budget)
        k = _aligned(len(pack_rows(sizes, token_budget)), group, device)
        bins = [[i for u in b for i in units[u]] for b in balance_rows(sizes, k)]
        return [MicroBatch(torch.tensor(sorted(b))) if b else MicroBatch(torch.tensor([0]), live=False) for b in bins]
    out = [MicroBatch(sl) for sl in micro_slices(attention_mask, response_width, max_rows, token_budget)]
    k = _aligned(len(out), group, device)
    return out + [MicroBatch(slice(0, 1), live=False)] * (k - len(out))


def _prompt_units(
    attention_mask: torch.Tensor, response_width: int, prompts: torch.Tensor | None, budget: int
) -> tuple[list[list[int]], list[int]]:
    """Rows that go to one micro-batch together, and their tokens: each row alone, or with `prompts` the rows of
    one prompt (as many as fit the token budget, the prompt counted once)."""
    resp = attention_mask[:, -response_width:].sum(1).tolist()
    lengths = attention_mask.sum(1).tolist()
    if prompts is None:
        return [[i] for i in range(len(lengths))], lengths
    units: list[list[int]] = []
    sizes: list[int] = []
    for rows in group_rows(prompt_keys(prompts, attention_mask, response_width)):
        unit: list[int] = []
        size = 0
        for i in rows:
            grown = (size or lengths[i] - resp[i]) + resp[i]
            if unit and grown > budget:
                units.append(unit)
                sizes.append(size)
                unit, grown = [], lengths[i]
            unit.append(i)
            size = grown
        units.append(unit)
        sizes.append(size)
    return units, sizes


def prompt_keys(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int) -> list[tuple[int, ...]]:
    """Each row's real prompt tokens, as a key: rows with equal keys share their prompt."""
    width = attention_mask.shape[1] - response_width
    real = attention_mask[:, :width].bool()
    return [tuple(input_ids[i, :width][real[i]].tolist()) for i in range(real.shape[0])]


def group_rows(keys: list[Any]) -> list[list[int]]:
    """Row indices grouped by equal keys, groups in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


@dataclass(frozen=True)
class Pack:
    """Samples' real tokens packed into k rows of equal length T (`pack`). `ids`, `pos` [k, T]; `segment`,
    `branch` [k, T]: which segment of its row each column belongs to and, within it, 0 for the (shared) prompt or
    1 + the response's index (None without shared prompts: the position ids then separate the samples); `keep`
    [K]: the columns whose outputs predict (or value) a response token in some row; `out_row`, `out_col`,
    `out_kept` [N]: for each of the N response tokens, its predicting position's row, column, and index in
    `keep`; `labels` [N]; `valid_bt` [b, R]: where those N outputs go back."""

    ids: torch.Tensor
    pos: torch.Tensor
    keep: torch.Tensor
    out_row: torch.Tensor
    out_col: torch.Tensor
    out_kept: torch.Tensor
    labels: torch.Tensor
    valid_bt: torch.Tensor
    tokens: int
    """Real tokens placed, a shared prompt once (the rest of the k x T cells is each row's slack)."""
    segment: torch.Tensor | None = None
    branch: torch.Tensor | None = None

    @property
    def cells(self) -> int:
        return self.ids.numel()

    def attention(self, device: torch.device, additive: torch.dtype | None = None) -> torch.Tensor:
        """[k, 1, T, T] mask of a row with shared prompts: a column sees the earlier columns of its segment's
        prompt and of its own branch. Boolean (True: attend), or `additive` (0 / most negative) for eager."""
        assert self.segment is not None and self.branch is not None
        seg, br = self.segment.to(device), self.branch.to(device)
        t = seg.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        same = (seg[:, :, None] == seg[:, None, :]) & ((br[:, None, :] == 0) | (br[:, :, None] == br[:, None, :]))
        allowed = (same & causal).unsqueeze(1)
        if additive is None:
            return allowed
        return torch.zeros(allowed.shape, dtype=additive, device=device).masked_fill(
            ~allowed, torch.finfo(additive).min
        )

    def inputs(self, device: torch.device, attn_implementation: str = "sdpa") -> dict[str, Any]:
        """The forward's keyword arguments. Without shared prompts no attention mask: HF's models read the
        restarts of the position ids as sample boundaries (a block-diagonal causal mask per row; varlen attention
        with flash-attn). Not with a KV cache (HF then reads them as one sequence): `use_cache=False`."""
        out: dict[str, Any] = {"input_ids": self.ids.to(device), "position_ids": self.pos.to(device)}
        if self.segment is not None:
            additive = None if attn_implementation == "sdpa" else torch.get_default_dtype()
            out["attention_mask"] = self.attention(device, additive)
        return {**out, "use_cache": False}

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


# Attention implementations that take a custom [b, 1, T, T] mask (shared prompts); flash-attn does not.
MASKABLE = ("sdpa", "eager")


def share_prompts(plen: list[int], resp: list[int], keys: list[Any], longest: int) -> list[list[int]]:
    """Samples into segments: one prompt and the responses that share it (`keys`: equal for equal prompts).

    A segment grows while its attention, (prompt + responses)^2, stays within that of the rows it replaces,
    members x longest^2: the prompt's tokens are then computed once for all members at no extra attention cost
    (GRPO's n samples of a prompt with short answers share most of their tokens; long answers share little and
    stay apart). Segments keep the samples' order; a sample alone is a segment of one.
    """
    out: list[list[int]] = []
    for members in group_rows(keys):
        seg: list[int] = []
        size = 0
        for i in sorted(members, key=lambda i: (-resp[i], i)):
            grown = (size or plen[i]) + resp[i]
            if seg and grown * grown > (len(seg) + 1) * longest * longest:
                out.append(seg)
                seg, grown = [], plen[i] + resp[i]
            seg.append(i)
            size = grown
        out.append(seg)
    return out


def pack(batch: Batch, rows: slice | torch.Tensor, shared: bool = False) -> Pack:
    """The real tokens of `rows` (left-padded prompt, then the response right after it) in rows as long as the
    longest segment, each sample with its own position ids 0, 1, ... A segment is one sample, or with `shared`
    one prompt followed by the responses of the samples that share it (`share_prompts`), which see the prompt
    and themselves only (`Pack.attention`). Rows are right-aligned, the segment with the longest response last:
    most responses then end in the same last columns, and the LM head (one set of columns for every row,
    `logits_to_keep`) runs over few columns. A row's leading slack is a run of positions of its own, which no
    real token attends to."""
    mask = batch.attention_mask[rows].bool()
    ids_b, pos_b = batch.input_ids[rows], batch.position_ids[rows]
    width = batch.response_width
    lengths = mask.sum(1).tolist()
    resp = mask[:, -width:].sum(1).tolist()
    plen = [n - r for n, r in zip(lengths, resp, strict=True)]
    longest = max(max(lengths), 1)
    if shared:
        segments = share_prompts(plen, resp, prompt_keys(ids_b, mask, width), longest)
    else:
        segments = [[i] for i in range(len(lengths))]
    seg_len = [plen[m[0]] + sum(resp[i] for i in m) for m in segments]
    cap = max(max(seg_len), 1)
    bins = pack_rows(seg_len, cap)
    masked = any(len(m) > 1 for m in segments)
    ids = torch.zeros(len(bins), cap, dtype=ids_b.dtype)
    pos = torch.zeros(len(bins), cap, dtype=pos_b.dtype)
    segment = torch.zeros(len(bins), cap, dtype=torch.long)
    branch = torch.zeros(len(bins), cap, dtype=torch.long)
    where_row = torch.zeros(mask.shape[0], width, dtype=torch.long)
    where_tgt = torch.zeros(mask.shape[0], width, dtype=torch.long)  # the column of response token t
    where_col = torch.zeros(mask.shape[0], width, dtype=torch.long)  # the column predicting it
    for r, members in enumerate(bins):
        for m in members:
            segments[m].sort(key=lambda i: (resp[i], i))  # the longest response ends its segment
        members = sorted(members, key=lambda m: (resp[segments[m][-1]], m))  # and the longest segment the row
        col = cap - sum(seg_len[m] for m in members)
        if col:  # slack: a run of positions the first sample restarts from, its first token repeated
            first = segments[members[0]][0]
            first_id, first_pos = ids_b[first][mask[first]][0], pos_b[first][mask[first]][0]
            ids[r, :col] = first_id
            pos[r, :col] = first_pos + 1 + torch.arange(col)
        for s, m in enumerate(members, start=1):
            lead = segments[m][0]
            p = plen[lead]
            segment[r, col : col + seg_len[m]] = s
            ids[r, col : col + p], pos[r, col : col + p] = ids_b[lead][mask[lead]][:p], pos_b[lead][mask[lead]][:p]
            last_prompt, col = col + p - 1, col + p
            for b, i in enumerate(segments[m], start=1):
                n, real = resp[i], mask[i, -width:]
                ids[r, col : col + n], pos[r, col : col + n] = ids_b[i, -width:][real], pos_b[i, -width:][real]
                branch[r, col : col + n] = b
                where_row[i] = r
                where_tgt[i] = col + torch.arange(width)
                where_col[i] = where_tgt[i] - 1
                where_col[i, 0] = last_prompt  # every member's first token is predicted by the prompt's end
                col += n
    valid_bt = torch.arange(width) < torch.tensor(resp).unsqueeze(1)
    out_row, out_col, target = where_row[valid_bt], where_col[valid_bt], where_tgt[valid_bt]
    if not len(out_col):  # nothing to score: one position keeps the graph (and FSDP's backward) together
        out_row, out_col = torch.zeros(1, dtype=torch.long), torch.full((1,), cap - 1, dtype=torch.long)
        target = out_col
    labels = ids[out_row, target]
    keep, out_kept = torch.unique(out_col, sorted=True, return_inverse=True)
    extra = {"segment": segment, "branch": branch} if masked else {}
    return Pack(ids, pos, keep, out_row, out_col, out_kept, labels, valid_bt, sum(seg_len), **extra)


def packed_forward_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    rows: slice | torch.Tensor,
    temperature: float,
    device: torch.device,
    shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """response_log_probs of `rows` packed without padding (`pack`), [b, R]; also the token cells computed and
    the real tokens among them. Only the columns that predict response tokens go through the LM head
    (`logits_to_keep`)."""
    p, inputs = packed_inputs(model, batch, rows, device, shared)
    out = model(**inputs, logits_to_keep=p.keep.to(device))
    logp, ent = logits_to_logprobs(p.kept(out.logits), p.labels.to(device), temperature, _never(model))
    return p.unpack(logp), p.unpack(ent).detach(), p.cells, p.tokens


def packed_inputs(
    model: torch.nn.Module, batch: Batch, rows: slice | torch.Tensor, device: torch.device, shared: bool
) -> tuple[Pack, dict[str, Any]]:
    """`pack` for `model` (prompts shared only where its attention takes a mask) and the forward's inputs."""
    config = getattr(model, "config", None)
    impl = str(getattr(config, "_attn_implementation", None) or "sdpa")
    p = pack(batch, rows, shared and impl in MASKABLE)
    return p, p.inputs(device, impl)


def can_pack(batch: Batch) -> bool:
    """Packing needs one row of position ids per sample: a vision model's M-RoPE positions and images do not
    pack here (verl and OpenRLHF do not pack VLM batches either)."""
    return not batch.has_images and batch.position_ids.dim() == 2


def forward_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    micro: MicroBatch,
    temperature: float,
    device: torch.device,
    packed: bool,
    shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The micro-batch's response logprobs and entropy [b, R], the token cells computed and the real tokens
    among them; `packed` only where `can_pack(batch)`, `shared`: packed with each prompt once for the samples
    that share it."""
    if packed:
        return packed_forward_log_probs(model, batch, micro.rows, temperature, device, shared)
    return padded_forward_log_probs(model, batch, micro.rows, temperature, device)
