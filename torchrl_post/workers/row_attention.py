"""Packed rows run as one flat sequence: every layer but attention computes each real token once (no row is padded
to the longest), and attention runs block by block, each sample over its own (and its prompt's) columns only.

A packed micro-batch (`workers/packing.py: Pack.trimmed`) is one [1, S] sequence, the concatenation of its rows
with their leading slack dropped. The embedding, MLPs, norms and LM head see S tokens; attention runs block by
block (`row_blocks`): each sample causally over its own columns or, with shared prompts, each prompt causally and
each response over the prompt's keys and its own. Only the pairs the samples' block-diagonal causal mask (or the
tree mask of shared prompts) allows are computed, so no attention grows past what separate rows would compute.

The plan reaches every attention layer as a keyword argument of the model call (`packed_rows`): transformers
hands the forward's extra keyword arguments down to each layer's attention function (as it does flash-attn's
`cu_seq_lens_q`), and a gradient-checkpointed layer keeps them for its recomputation. `install` wraps the
registered sdpa implementation once: a call with the argument attends block by block, any other call is sdpa's
own.
The model call gets an empty [1, 1, 0, 0] mask in place of transformers' own (which it takes as prepared, so no
[S, S] mask is built): a model that did not pass the argument on would fail loudly in sdpa on it, never attend
across rows.

Simplified on purpose: sdpa only (eager and Ulysses keep the batched rows, `packing.packed_inputs`); flash-attn
needs no plan (its varlen arguments already cut the flat sequence into samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

KEY = "packed_rows"
"""The model call's keyword argument that carries the `RowAttention` plan."""


Span = tuple[int, int]
"""Columns [start, end) of the flat sequence."""


@dataclass(frozen=True, eq=False)
class Block:
    """One sdpa call: the queries at columns `query`, the keys and values at `keys` (spans, concatenated in
    order), and a boolean [1, 1, q, k] mask (True: attend), or None where the keys are the queries' own columns
    under a causal mask (sdpa's `is_causal`, which also skips the upper triangle)."""

    query: Span
    keys: tuple[Span, ...]
    mask: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class RowAttention:
    """The blocks of a flat [1, S] sequence, in column order, covering every column once."""

    blocks: tuple[Block, ...]

    @cached_property
    def pieces(self) -> tuple[list[int], list[list[int]]]:
        """The blocks' query spans partition the columns and every key span is one of them: the spans' widths
        (where q, k and v split, once per layer) and, per block, the indices of its key spans among them (block i's
        queries are piece i). Derived once per pack, not in each layer."""
        index = {blk.query: i for i, blk in enumerate(self.blocks)}
        return [e - s for s, e in index], [[index[span] for span in blk.keys] for blk in self.blocks]


def row_blocks(
    start: int, pos: torch.Tensor, segment: torch.Tensor | None, branch: torch.Tensor | None, device: torch.device
) -> list[Block]:
    """The blocks of one row whose first column is `start`, from its [L] position ids (a sample starts where they
    do not go on by one: a causal block per sample) or, with shared prompts, its segment and branch ids
    (`Pack.attention`): per segment a causal block over its prompt and, per response, a block whose queries are
    the response's columns and whose keys are the prompt's and its own (the prompt all visible, itself causal).
    Only the tree mask's allowed pairs are computed: no query meets another sample's keys."""
    n = pos.shape[0]
    cut = torch.ones(n, dtype=torch.bool)
    if segment is None or branch is None:
        cut[1:] = pos[1:] != pos[:-1] + 1
    else:
        cut[1:] = (segment[1:] != segment[:-1]) | (branch[1:] != branch[:-1])
    edges = [*cut.nonzero().squeeze(-1).tolist(), n]
    blocks: list[Block] = []
    prompt: Span | None = None
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        span = (start + a, start + b)
        if segment is None or branch is None or int(branch[a]) == 0:
            prompt = span
            blocks.append(Block(span, (span,)))
            continue
        if prompt is None or int(segment[prompt[0] - start]) != int(segment[a]):  # a response without a prompt
            blocks.append(Block(span, (span,)))
            continue
        width, m = prompt[1] - prompt[0], b - a
        mask = torch.ones(m, width + m, dtype=torch.bool, device=device)
        mask[:, width:] = torch.ones(m, m, dtype=torch.bool, device=device).tril()
        blocks.append(Block(span, (prompt, span), mask[None, None]))
    return blocks


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
    """sdpa, with a `packed_rows` plan block by block: q [1, H, S, d], k and v [1, Hkv, S, d] -> ([1, S, H, d], None)
    (each block's queries through sdpa over its keys, the outputs concatenated back in column order)."""
    plan = kwargs.pop(KEY, None)
    if plan is None:
        return _SDPA(module, query, key, value, attention_mask, *args, **kwargs)  # type: ignore[no-any-return]
    assert isinstance(plan, RowAttention) and query.shape[0] == 1, "a packed_rows plan takes one flat row"
    kwargs.pop("is_causal", None)
    # Split once at the blocks' edges: a block takes views, whose backward writes into one gradient per piece
    # (slicing each block from the whole [1, H, S, d] tensor would allocate and fill a full-size zero gradient per
    # slice).
    sizes, keys = plan.pieces
    qs, ks, vs = (t.split(sizes, dim=2) for t in (query, key, value))
    grouped = _grouped_masked(module, query, args, kwargs)
    outs = []
    for i, (blk, own) in enumerate(zip(plan.blocks, keys, strict=True)):
        k = ks[own[0]] if len(own) == 1 else torch.cat([ks[j] for j in own], dim=2)
        v = vs[own[0]] if len(own) == 1 else torch.cat([vs[j] for j in own], dim=2)
        if blk.mask is not None and grouped is not None:
            out = F.scaled_dot_product_attention(qs[i], k, v, blk.mask, enable_gqa=True, **grouped)
            outs.append(out.transpose(1, 2))
        else:
            outs.append(_SDPA(module, qs[i], k, v, blk.mask, *args, **kwargs)[0])
    return torch.cat(outs, dim=1), None


def _grouped_masked(
    module: torch.nn.Module, query: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """sdpa's arguments for a masked block whose fewer key heads the kernel groups itself (`enable_gqa`), or None
    where transformers' own sdpa is called. transformers repeats the key and value heads wherever a mask is given
    (`repeat_kv`: a copy forward, a sum backward), which on CUDA keeps the masked call on a fused kernel (its
    grouped sdpa with a mask is the math one). CPU's flash kernel takes both: SmolLM2's shapes (9 heads, 3 key
    heads, 4 prompts x 8 responses) 70-80 -> 58-65 ms a layer forward and backward. None too for a call this does not
    mirror (positional arguments, a position bias, attention sinks)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if query.device.type != "cpu" or groups <= 1 or args or set(kwargs) - _PASSED_OVER:
        return None
    return {"dropout_p": float(kwargs.get("dropout", 0.0)), "scale": kwargs.get("scaling")}


_PASSED_OVER = {"dropout", "scaling", "position_ids", "sliding_window", "output_attentions", "use_cache"}
"""The layers' keyword arguments that transformers' sdpa function reads as `_grouped_masked` does (dropout,
scaling) or not at all."""


def install() -> None:
    """Wrap the registered sdpa implementation (once per process): calls without a plan are unchanged."""
    global _SDPA
    current = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if current is not row_attention_forward:
        _SDPA = current
        AttentionInterface.register("sdpa", row_attention_forward)
