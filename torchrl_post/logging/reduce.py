"""Metric reduction over a process group, by name: every rank passes {name: (op, local value)}.

    reduce_metrics({"response_length/max": ("max", 7.0), "tokens": ("sum", 120.0)}, group)

Ops: `sum`, `mean` (the sum divided by the group's size: a mean of per-rank values), `max`, `min`. One
all_reduce per op kind, in float64, in a fixed order of names, so every rank must pass the same names.
`group=None` reduces over the default group; a world of one returns the local values.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

REDUCE_OPS = ("sum", "mean", "max", "min")
_DIST_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

Local = dict[str, tuple[str, float]]


def reduce_metrics(local: Local, group: Any = None, device: torch.device | None = None) -> dict[str, float]:
    """Reduce every named value with its op over `group`; returns {name: reduced value}."""
    unknown = {op for op, _ in local.values()} - set(REDUCE_OPS)
    if unknown:
        raise ValueError(f"unknown reduce ops {sorted(unknown)}; expected one of {', '.join(REDUCE_OPS)}")
    distributed = dist.is_available() and dist.is_initialized()
    size = dist.get_world_size(group) if distributed else 1
    out: dict[str, float] = {}
    for kind in ("sum", "max", "min"):  # mean travels with sum
        names = sorted(k for k, (op, _) in local.items() if _DIST_OPS[op] == _DIST_OPS[kind])
        if not names:
            continue
        t = torch.tensor([float(local[k][1]) for k in names], dtype=torch.float64, device=device)
        if distributed and size > 1:
            dist.all_reduce(t, op=_DIST_OPS[kind], group=group)
        for k, v in zip(names, t.tolist(), strict=True):
            out[k] = v / size if local[k][0] == "mean" else v
    return out
