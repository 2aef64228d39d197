"""DeepSpeed-Ulysses collectives: move attention's split from the sequence to the heads and back, and a
differentiable sum over the sequence-parallel group.

    q_bhsd = seq_to_heads(q_bhsd, group)   # [b, H, S/sp, d] (a sequence shard)  -> [b, H/sp, S, d] (a head block)
    o_bhsd = heads_to_seq(o_bhsd, group)   # [b, H/sp, S, d]                      -> [b, H, S/sp, d]
    loss = sum_over(local_loss, group)     # every rank holds the group's sum

Rank r holds sequence columns r*S/sp:(r+1)*S/sp before the exchange and heads r*H/sp:(r+1)*H/sp after it. Each
exchange is one `all_to_all_single` (NCCL on GPU, gloo on CPU: the backend of the group, nothing chosen here);
its backward is the inverse exchange.

What it costs: per attention layer and forward, three all-to-alls in (q, k, v; k and v at the kv head count,
or repeated up to a multiple of sp) and one out, each sending (sp-1)/sp of the tensor a rank holds: per rank
(2 H + 2 Hkv) * b * (S/sp) * d * bytes * (sp-1)/sp per layer. The backward runs the same four in reverse on the
gradients, and a checkpointed layer's recomputation runs the forward's again. Everything outside attention runs
on the rank's shard alone.

With `group` None or of one rank every function here is the identity.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def group_size(group: dist.ProcessGroup | None) -> int:
    """Ranks in `group`; 1 for None (no sequence parallelism)."""
    return 1 if group is None else dist.get_world_size(group)


def _exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Split `x` into sp chunks along scatter_dim, send chunk j to rank j, and concatenate what arrives (rank i's
    chunk at place i) along gather_dim."""
    sp = dist.get_world_size(group)
    send = torch.stack(x.chunk(sp, dim=scatter_dim)).contiguous()  # [sp, ...]: chunk j for rank j
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup
    ) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _exchange(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def seq_to_heads(x_bhsd: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """[b, H, s, d], this rank's sequence shard -> [b, H/sp, s*sp, d], this rank's heads over the whole sequence.
    H must divide by sp."""
    if group_size(group) == 1:
        return x_bhsd
    assert group is not None and x_bhsd.shape[1] % dist.get_world_size(group) == 0, x_bhsd.shape
    return _AllToAll.apply(x_bhsd, 1, 2, group)


def heads_to_seq(x_bhsd: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """[b, H/sp, S, d], this rank's heads -> [b, H, S/sp, d], every head over this rank's sequence shard (the
    inverse of `seq_to_heads`). S must divide by sp."""
    if group_size(group) == 1:
        return x_bhsd
    assert group is not None and x_bhsd.shape[2] % dist.get_world_size(group) == 0, x_bhsd.shape
    return _AllToAll.apply(x_bhsd, 2, 1, group)


class _SumOver(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = t.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def sum_over(t: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The sum of `t` over the ranks of `group`, on every rank, differentiably: the backward all-reduces the
    incoming gradients too (the adjoint of y_j = sum_i x_i for every j is dx_i = sum_j dy_j).

    So when each of the sp ranks calls backward on the same summed loss, each rank's share receives gradient sp,
    not 1: the parameter gradients summed over the group are sp times the gradient of the loss, and their mean
    over the group (what FSDP's averaging reduce computes over dp x sp ranks) is exactly it. (This is
    torch.distributed.nn.functional.all_reduce, which is deprecated and warns on every call.)"""
    if group_size(group) == 1:
        return t
    assert group is not None
    return _SumOver.apply(t, group)
