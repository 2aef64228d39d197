"""DeepSpeed-Ulysses sequence parallelism for one model call: each of sp ranks runs the model on a contiguous
shard of every row's columns; attention alone sees the whole sequence, its heads split over the ranks.

    shard = SequenceShard.of(group)
    with sequence_parallel(model, shard, inputs) as local_inputs:   # inputs: the forward's full keyword arguments
        hidden = model(**local_inputs, ...)                          # this rank's columns shard.span(T) only
        loss = sum_over(local_loss, shard.group)
    loss.backward()                              # after the block too, gradient checkpointing included

`inputs` is what the project builds for a forward: padded rows (`multimodal.vision.model_inputs`: input_ids,
a 2-D attention_mask, position_ids) or packed rows (`workers.packing.Pack.inputs`: input_ids, position_ids, and for
shared prompts a 4-D [k, 1, T, T] mask). Rows are padded at the end to a multiple of sp (mask 0, position ids
going on by one, so each rank's rotary embedding gets its columns' global positions), and each rank is handed its
shard of input_ids and position_ids. For the call, the model's attention implementation is `ulysses`
(transformers' AttentionInterface, restored on exit): per layer it exchanges q, k and v from the sequence split
to the head split (`distributed.ulysses.seq_to_heads`), attends over the whole sequence with the global mask of
the rows, and exchanges the output back. The global mask (`global_attention_mask`) is built once per call and
travels in place of transformers' mask (the per-layer-type dict that the model takes as already prepared), so
transformers builds no mask for the shard and a checkpointed layer's recomputation gets the same one.

Cost. Per attention layer and forward: all-to-alls of q, k, v (k and v at the model's kv head count, repeated
up to a multiple of sp first when it does not divide) and of the output, each moving (sp-1)/sp of the tensor a
rank holds; the same four in the backward, and again in a checkpointed layer's recomputation. The MLPs, norms,
embedding and LM head run on S/sp columns. Masks: a plain causal row (no padding inside, no packing) attends
with is_causal and no mask; padded, packed and shared-prompt rows materialise a [b, 1, S, S] boolean mask on
every rank (S^2 bytes per row), as sdpa over the unsharded rows does.

Simplified on purpose: sdpa and eager only (flash-attn would take the global sequence's cu_seqlens: not written,
refused with an error); full attention layers only (no sliding window); text-only causal LMs (no M-RoPE
position ids or images). The model keeps the `ulysses` implementation after the block (`_INNER` remembers its
own): every later forward of it must come through `sequence_parallel` (the attention refuses a call without
the plan), and a gradient-checkpointed layer's recomputation in a backward after the block finds the plan in
its saved inputs. Setting another implementation on the model (`set_attn_implementation`) makes that the one
the next block runs inside.
"""

from __future__ import annotations

import contextvars
import math
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from transformers import AttentionInterface

from torchrl_post.distributed.ulysses import group_size, heads_to_seq, seq_to_heads

ATTENTION = "ulysses"
"""The name this module's attention function is registered under (transformers' AttentionInterface)."""
INNER = ("sdpa", "eager")
"""The model's own attention implementations that run inside the exchange."""
INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "use_cache")


@dataclass(frozen=True)
class SequenceShard:
    """This rank's place in the sequence-parallel group: rank r of `size` holds columns r*w:(r+1)*w of rows padded
    to a multiple of `size` (w = the padded length / size). `group` None: one rank, no sequence parallelism."""

    group: dist.ProcessGroup | None
    rank: int
    size: int

    @classmethod
    def of(cls, group: dist.ProcessGroup | None) -> SequenceShard:
        return cls(group, 0 if group is None else dist.get_rank(group), group_size(group))

    def pad_to(self, n: int) -> int:
        """The smallest multiple of size >= n."""
        return -(-n // self.size) * self.size

    def span(self, total: int) -> tuple[int, int]:
        """(start, end) of this rank's columns of a row of `total` columns (end may pass `total`: padding)."""
        width = self.pad_to(total) // self.size
        return self.rank * width, (self.rank + 1) * width

    def local(self, t: torch.Tensor, dim: int, value: float = 0) -> torch.Tensor:
        """`t` padded along `dim` with `value` to a multiple of size, and this rank's contiguous slice of it."""
        if self.size == 1:
            return t
        n = t.shape[dim]
        start, end = self.span(n)
        if self.pad_to(n) > n:
            shape = list(t.shape)
            shape[dim] = self.pad_to(n) - n
            t = torch.cat([t, t.new_full(shape, value)], dim=dim)
        return t.narrow(dim, start, end - start)


def pad_positions(position_ids: torch.Tensor, length: int) -> torch.Tensor:
    """[..., T] position ids -> [..., length]: the padding columns go on by one from each row's last position
    (in a packed row they join its last sample, after it: causal attention keeps them from every real token)."""
    extra = length - position_ids.shape[-1]
    steps = torch.arange(1, extra + 1, device=position_ids.device, dtype=position_ids.dtype)
    return torch.cat([position_ids, position_ids[..., -1:] + steps], dim=-1)


def _causal(length: int, device: torch.device) -> torch.Tensor:
    """[length, length] boolean, True on and below the diagonal."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def global_attention_mask(inputs: dict[str, Any], length: int) -> torch.Tensor | None:
    """The [b, 1, length, length] boolean mask (True: attend) of the full rows of `inputs`, padded at the end
    to `length` columns; None where plain causal attention is exact (no padding inside the rows, no packing).
    As transformers reads the same inputs: a 4-D mask as given; a 2-D mask as causal & key padding (position
    ids are then not read); no mask: causal within the runs of position ids going on by one (packed samples).
    Every query sees itself, so no row is fully masked (a padding query's output is garbage, never NaN)."""
    ids = inputs["input_ids"]
    b, t = ids.shape
    mask = inputs.get("attention_mask")
    device = ids.device
    if mask is not None and mask.dim() == 4:
        allowed = mask if mask.dtype == torch.bool else mask == 0  # additive (eager): 0 where attended
        allowed = torch.nn.functional.pad(allowed, (0, length - t, 0, length - t), value=False)
    else:
        # the [length, length] causal mask only past the returns: on a plain causal row it would be a transient
        # S^2 bytes on every rank, more than the activations that sp divides (benchmarks/sequence_parallel.py)
        if mask is not None:
            if bool(mask.all()):
                return None  # the end padding is causally after every real token
            keys = torch.nn.functional.pad(mask.bool(), (0, length - t), value=False)
            allowed = _causal(length, device) & keys[:, None, None, :]
        else:
            pos = inputs.get("position_ids")
            if pos is None:
                return None
            pos = pad_positions(pos.expand(b, -1), length)
            starts = torch.ones_like(pos, dtype=torch.bool)
            starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
            sample = starts.cumsum(-1)
            if bool((sample[:, -1] == 1).all()):
                return None  # one sample per row
            allowed = _causal(length, device) & (sample[:, None, :, None] == sample[:, None, None, :])
    return allowed | torch.eye(length, dtype=torch.bool, device=device)


@dataclass(frozen=True, eq=False)
class GlobalAttention:
    """What every attention layer of one sequence-parallel call needs, handed down in place of the mask:
    the group, the global mask (None: causal), and the model's own implementation to run inside."""

    group: dist.ProcessGroup
    mask: torch.Tensor | None
    inner: str


def _repeat_heads(x: torch.Tensor, times: int) -> torch.Tensor:
    """[b, h, s, d] -> [b, h*times, s, d], each head `times` times in a row (transformers' repeat_kv)."""
    return x if times == 1 else torch.repeat_interleave(x, times, dim=1)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: GlobalAttention, dropout: float, scale: float
) -> torch.Tensor:
    """Attention of [b, h, S, d] heads over the whole sequence, with the plan's mask (None: causal)."""
    k, v = _repeat_heads(k, q.shape[1] // k.shape[1]), _repeat_heads(v, q.shape[1] // v.shape[1])
    mask = plan.mask
    if plan.inner == "sdpa":
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scale
        )
    if mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    w = w.masked_fill(~mask, torch.finfo(w.dtype).min)
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    w = torch.nn.functional.dropout(w, p=dropout, training=dropout > 0)
    return torch.matmul(w, v)


def ulysses_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The `ulysses` attention implementation: q [b, H, s, d], k and v [b, Hkv, s, d] of this rank's columns ->
    ([b, s, H, d], None), attended over the whole sequence. `attention_mask` is the call's GlobalAttention."""
    plan = attention_mask if isinstance(attention_mask, GlobalAttention) else _CALL_PLAN.get(None)
    if plan is None and not isinstance(attention_mask, torch.Tensor):
        # a checkpointed layer recomputed in the backward, after the block, of a model that dropped the plan
        plan = _LAST_PLAN.get(module)
    if isinstance(plan, GlobalAttention):
        _LAST_PLAN[module] = plan
    if not isinstance(plan, GlobalAttention):
        raise RuntimeError(
            f"the {ATTENTION} attention ran without its plan (got {type(plan).__name__}): call the model inside "
            "`sequence_parallel`, with the inputs it yields"
        )
    assert sliding_window is None, "refused in sequence_parallel"
    sp = dist.get_world_size(plan.group)
    if key.shape[1] % sp:  # too few kv heads to split: repeat each (as repeat_kv) up to a multiple of sp
        times = sp // math.gcd(key.shape[1], sp)  # divides H/Hkv, since sp divides H
        key, value = _repeat_heads(key, times), _repeat_heads(value, times)
    q, k, v = (seq_to_heads(x, plan.group) for x in (query, key, value))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = _attend(q, k, v, plan, dropout, scale)
    return heads_to_seq(out, plan.group).transpose(1, 2).contiguous(), None


def _check(model: torch.nn.Module, shard: SequenceShard, inputs: dict[str, Any]) -> str:
    """The model's own attention implementation, after the checks that sequence parallelism can run it."""
    config: Any = model.config  # a transformers config (the model may be FSDP- or PEFT-wrapped)
    inner = own_attention(model)
    if inner not in INNER:
        raise ValueError(
            f"sequence parallelism runs the model's attention as {' or '.join(INNER)}, not {inner!r}: load the "
            "model with attn_implementation='sdpa' (flash-attn under Ulysses is not written yet)"
        )
    if config.sub_configs:
        raise ValueError(f"sequence parallelism takes text-only causal LMs, not {type(config).__name__}")
    heads = config.num_attention_heads
    if heads % shard.size:
        raise ValueError(
            f"sequence parallelism over {shard.size} ranks splits the attention heads: the model's "
            f"num_attention_heads={heads} does not divide by {shard.size}; use a size that divides it"
        )
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(f"sequence parallelism takes full attention layers only, not {sorted(kinds)}")
    extra = sorted(set(inputs) - set(INPUT_KEYS))
    if extra:
        raise ValueError(f"sequence parallelism takes the inputs {INPUT_KEYS}, not {extra}")
    pos = inputs.get("position_ids")
    if pos is not None and pos.dim() != 2:
        raise ValueError(f"sequence parallelism takes [b, T] position ids, not {list(pos.shape)} (M-RoPE)")
    return inner


_INNER: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
_LAST_PLAN: weakref.WeakKeyDictionary[torch.nn.Module, GlobalAttention] = weakref.WeakKeyDictionary()
"""Each attention module's plan of its last forward: what its recomputation under activation checkpointing (in the
backward, outside `sequence_parallel`) attends with when the model's forward did not pass the plan on."""
_CALL_PLAN: contextvars.ContextVar[GlobalAttention | None] = contextvars.ContextVar("ulysses_plan", default=None)
"""The plan of the `sequence_parallel` block being run: for models whose forward builds its causal mask whatever
it is given (transformers' Qwen3-MoE calls create_causal_mask on the prepared mask mapping, which comes back
None), so the plan never reaches their attention through `attention_mask`."""
"""A model switched to the `ulysses` implementation -> its own (sdpa or eager). The switch stays for the model's
life: a sequence-parallel model runs every forward through `sequence_parallel`, and a checkpointed layer's
recomputation in a backward after the block still finds `ulysses` and the call's plan in its saved inputs."""


def own_attention(model: torch.nn.Module) -> str:
    """The model's own attention implementation (the one `ulysses` runs inside, once switched)."""
    impl = str(getattr(model.config, "_attn_implementation", None) or "sdpa")
    return _INNER[model] if impl == ATTENTION else impl


@contextmanager
def sequence_parallel(model: torch.nn.Module, shard: SequenceShard, inputs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One model call on this rank's shard of `inputs` (the full rows' forward arguments, the same on every rank
    of the group): yields the local inputs, with the model's attention routed through `ulysses` for the block.

    Outputs at local column j belong to global column shard.span(T)[0] + j; columns at T and beyond are padding.
    With one rank it yields `inputs` unchanged and changes nothing."""
    if shard.size == 1:
        yield inputs
        return
    inner = _check(model, shard, inputs)
    assert shard.group is not None
    ids = inputs["input_ids"]
    length = shard.pad_to(ids.shape[1])
    pos = inputs.get("position_ids")
    if pos is None:
        pos = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
    plan = GlobalAttention(shard.group, global_attention_mask(inputs, length), inner)
    start, end = shard.span(ids.shape[1])
    local = {
        "input_ids": shard.local(ids, 1),
        "position_ids": pad_positions(pos, length)[:, start:end],
        # as if already prepared: transformers builds no mask for the shard and hands each layer the plan
        "attention_mask": {"full_attention": plan},
        "use_cache": False,
    }
    if model.config._attn_implementation != ATTENTION:  # type: ignore[union-attr]
        AttentionInterface.register(ATTENTION, ulysses_attention_forward)
        model.set_attn_implementation(ATTENTION)  # type: ignore[operator]
        if model.config._attn_implementation != ATTENTION:  # type: ignore[union-attr]
            raise ValueError(
                f"{type(model).__name__} does not route its attention through transformers' AttentionInterface"
            )
        _INNER[model] = inner
    token = _CALL_PLAN.set(plan)
    try:
        yield local
    finally:
        _CALL_PLAN.reset(token)
