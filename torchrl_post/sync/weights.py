"""Weight sync, trainer -> rollout engine: FSDP2 shards gathered bucket by bucket, in HF names.

`iter_full_weights` is a generator: each bucket (many parameters, up to `bucket_bytes`) costs one
all_gather over the actor mesh, and is handed on before the next is gathered, so a consumer (vLLM's
reload) can load bucket k while nothing else is held. Every colocated rank must consume the generator
in the same order: the gathers are collectives.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from torchrl_post.rollout.base import RolloutEngine


def _rows_per_rank(dim0: int, world: int) -> int:
    return -(-dim0 // world)  # DTensor Shard(0) follows torch.chunk: ceil-sized chunks, short tail


def _gather_bucket(bucket: list[tuple[str, DTensor]], group: dist.ProcessGroup) -> Iterator[tuple[str, torch.Tensor]]:
    """One all_gather for a bucket of Shard(0) DTensors of one dtype; yields the full tensors."""
    world = dist.get_world_size(group)
    layout = []  # (name, full shape, rows per rank, elements per padded rank slot)
    for name, p in bucket:
        shape = tuple(p.shape)
        rows = _rows_per_rank(shape[0], world)
        layout.append((name, shape, rows, rows * (p.numel() // max(shape[0], 1))))
    slot = sum(n for *_, n in layout)
    local = bucket[0][1].to_local()
    send = torch.zeros(slot, dtype=local.dtype, device=local.device)
    offset = 0
    for (_, p), (_, _, _, n) in zip(bucket, layout, strict=True):
        flat = p.to_local().reshape(-1)
        send[offset : offset + flat.numel()] = flat
        offset += n
    recv = torch.empty(world * slot, dtype=send.dtype, device=send.device)
    dist.all_gather_single(recv, send, group=group)
    offset = 0
    for name, shape, rows, n in layout:
        row_numel = n // rows if rows else 0
        parts = []
        for r in range(world):
            have = max(0, min(rows, shape[0] - r * rows))
            start = r * slot + offset
            parts.append(recv[start : start + have * row_numel])
        offset += n
        yield name, torch.cat(parts).view(shape)


def _is_row_sharded(p: torch.Tensor) -> bool:
    return isinstance(p, DTensor) and p.device_mesh.ndim == 1 and p.placements == (Shard(0),)


def iter_full_weights(model: torch.nn.Module, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every parameter, gathered in buckets of about `bucket_bytes`."""
    bucket: list[tuple[str, DTensor]] = []
    size = 0
    for name, param in model.named_parameters():
        p = param.detach()
        if not isinstance(p, DTensor) or not _is_row_sharded(p):
            yield from _flush(bucket)
            bucket, size = [], 0
            yield name, p.full_tensor() if isinstance(p, DTensor) else p
            continue
        if bucket and (bucket[0][1].dtype != p.dtype or size + p.numel() * p.element_size() > bucket_bytes):
            yield from _flush(bucket)
            bucket, size = [], 0
        bucket.append((name, p))
        size += p.numel() * p.element_size()
    yield from _flush(bucket)


def _flush(bucket: list[tuple[str, DTensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    if bucket:
        yield from _gather_bucket(bucket, bucket[0][1].device_mesh.get_group())


def sync_weights(model: torch.nn.Module, engine: RolloutEngine, bucket_mb: int) -> int:
    """Push the actor's current weights into the colocated engine; returns the bytes moved."""
    moved = 0

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal moved
        for name, t in iter_full_weights(model, bucket_mb << 20):
            moved += t.numel() * t.element_size()
            yield name, t

    engine.load_weights(counted())
    return moved
