"""Packed rows run as one flat sequence: every layer but attention computes each real token once (no row is padded
to the longest), and attention runs row by row, each row over its own columns only.

A packed micro-batch (`workers/packing.py: Pack.trimmed`) is one [1, S] sequence, the concatenation of its rows
with their leading slack dropped. The embedding, MLPs, norms and LM head see S tokens; a row of L columns attends
over its [L, L] mask alone (its samples' block-diagonal causal mask, or the tree mask of shared prompts), so no
attention grows past what the batched [k, T] rows computed.

The plan reaches every attention layer as a keyword argument of the model call (`packed_rows`): transformers
hands the forward's extra keyword arguments down to each layer's attention function (as it does flash-attn's
`cu_seq_lens_q`), and a gradient-checkpointed layer keeps them for its recomputation. `install` wraps the
registered sdpa implementation once: a call with the argument attends row by row, any other call is sdpa's own.
The model call gets an empty [1, 1, 0, 0] mask in place of transformers' own (which it takes as prepared, so no
[S, S] mask is built): a model that did not pass the argument on would fail loudly in sdpa on it, never attend
across rows.

Simplified on purpose: sdpa only (eager and Ulysses keep the batched rows, `packing.packed_inputs`); flash-attn
needs no plan (its varlen arguments already cut the flat sequence into samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

KEY = "packed_rows"
"""The model call's keyword argument that carries the `RowAttention` plan."""


@dataclass(frozen=True, eq=False)
class RowAttention:
    """The rows of a flat [1, S] sequence: `bounds` (start, end) of each row's columns, and each row's boolean
    [1, 1, L, L] mask (True: attend), or None for a row that is one causal sequence."""

    bounds: tuple[tuple[int, int], ...]
    masks: tuple[torch.Tensor | None, ...]


def row_masks(pos: torch.Tensor, segment: torch.Tensor | None, branch: torch.Tensor | None) -> torch.Tensor | None:
    """The [1, 1, L, L] boolean mask of one row from its [L] position ids (a sample starts where they do not go
    on by one) or, with shared prompts, its segment and branch ids (`Pack.attention`); None: one causal run."""
    n = pos.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool, device=pos.device).tril()
    if segment is None or branch is None:
        starts = torch.ones(n, dtype=torch.bool, device=pos.device)
        starts[1:] = pos[1:] != pos[:-1] + 1
        if int(starts.sum()) == 1:
            return None
        sample = starts.cumsum(0)
        return (causal & (sample[:, None] == sample[None, :]))[None, None]
    same = (segment[:, None] == segment[None, :]) & ((branch[None, :] == 0) | (branch[:, None] == branch[None, :]))
    return (same & causal)[None, None]


_SDPA: Any = None
"""transformers' own sdpa attention function, wrapped by `install`."""


def row_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """sdpa, with a `packed_rows` plan row by row: q [1, H, S, d], k and v [1, Hkv, S, d] -> ([1, S, H, d], None)
    (each row's columns through sdpa with its own mask, the outputs concatenated back in column order)."""
    plan = kwargs.pop(KEY, None)
    if plan is None:
        return _SDPA(module, query, key, value, attention_mask, *args, **kwargs)  # type: ignore[no-any-return]
    assert isinstance(plan, RowAttention) and query.shape[0] == 1, "a packed_rows plan takes one flat row"
    kwargs.pop("is_causal", None)
    outs = [
        _SDPA(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], mask, *args, **kwargs)[0]
        for (s, e), mask in zip(plan.bounds, plan.masks, strict=True)
    ]
    return torch.cat(outs, dim=1), None


def install() -> None:
    """Wrap the registered sdpa implementation (once per process): calls without a plan are unchanged."""
    global _SDPA
    current = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if current is not row_attention_forward:
        _SDPA = current
        AttentionInterface.register("sdpa", row_attention_forward)
