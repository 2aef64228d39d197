"""Micro-batch planning: a batch's rows into forwards of bounded rows or tokens, the same count on every FSDP rank."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.workers.packing import balance_rows, group_rows, pack_rows, prompt_keys


def chunks(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most `size` rows covering range(n)."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


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


@dataclass(frozen=True)
class MicroBatch:
    """Rows of a (mini-)batch forwarded together. `live=False`: a stand-in that only keeps this rank's FSDP
    collectives in step with ranks that have more micro-batches (its loss is multiplied by zero)."""

    rows: slice | torch.Tensor
    live: bool = True


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

    Fixed size (`token_budget` 0): `max_rows` consecutive rows each, padded or packed (as many as the rank with the
    most rows has). Dynamic
    (`token_budget` > 0): padded, as many consecutive rows as fit rows x trimmed width; packed, the rows
    balanced into as many packs as the rank that needs the most needs (first-fit decreasing of real tokens
    into the budget), so every pack holds about the same number of tokens; with `prompts` (the input ids: packed
    with shared prompts) the samples of a prompt stay together, counted with their prompt once. Ranks short of
    micro-batches run stand-ins (`live=False`).
    """
    if token_budget <= 0:  # ranks may hold different row counts (the update skips rows of advantage 0)
        fixed = [MicroBatch(sl) for sl in chunks(attention_mask.shape[0], max_rows)]
        return fixed + [MicroBatch(slice(0, 1), live=False)] * (_aligned(len(fixed), group, device) - len(fixed))
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
