"""Weight sync, trainer -> rollout engine: FSDP2 shards gathered bucket by bucket, in HF names.

`iter_full_weights` is a generator: each bucket (many parameters, up to `bucket_bytes`) costs one
all_gather over the actor mesh, and is handed on before the next is gathered, so a consumer (vLLM's
reload) can load bucket k while nothing else is held. Every colocated rank must consume the generator
in the same order: the gathers are collectives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from torchrl_post.distributed.env import RawGroup
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


def _shard_group(p: torch.Tensor) -> dist.ProcessGroup | None:
    """The group to gather over for FSDP (Shard(0) on a 1-D mesh) and HSDP (Replicate, Shard(0)) params."""
    if not isinstance(p, DTensor) or p.placements[-1] != Shard(0):
        return None
    if not all(pl.is_replicate() for pl in p.placements[:-1]):
        return None
    return p.device_mesh.get_group(p.device_mesh.ndim - 1)


def iter_full_weights(model: torch.nn.Module, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every parameter, gathered in buckets of about `bucket_bytes`."""
    bucket: list[tuple[str, DTensor]] = []
    size = 0
    for name, param in model.named_parameters():
        p = param.detach()
        if not isinstance(p, DTensor) or _shard_group(p) is None:
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
        group = _shard_group(bucket[0][1])
        assert group is not None
        yield from _gather_bucket(bucket, group)


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


# ---- disaggregated: one actor rank broadcasts flat buckets to the rollout ranks --------------------------------

Spec = tuple[str, tuple[int, ...], torch.dtype]  # HF name, full shape, dtype on the wire


def plan_buckets(specs: list[Spec], bucket_bytes: int) -> list[list[Spec]]:
    """Split parameters, in order, into buckets of one dtype and at most `bucket_bytes` (a larger tensor alone)."""
    buckets: list[list[Spec]] = []
    size = 0
    for spec in specs:
        nbytes = _numel(spec[1]) * spec[2].itemsize
        if not buckets or buckets[-1][0][2] != spec[2] or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(spec)
        size += nbytes
    return buckets


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class BroadcastSync:
    """Weight sync over the `sync` group ({first actor rank} + rollout ranks, rank 0 the sender).

    The sender packs the gathered full tensors into flat buckets (cast to the engine's dtype) and broadcasts
    each one asynchronously while the next is gathered; receivers post the broadcast of bucket k+1 before
    handing bucket k's views to the engine. Every actor rank calls `send` (the gathers are collectives over
    the actor mesh); only the actor rank in the group broadcasts. The layout goes over once, at construction.
    """

    def __init__(
        self,
        group: RawGroup | None,
        device: torch.device,
        bucket_bytes: int,
        wire_dtype: torch.dtype,
        model: torch.nn.Module | None = None,
    ) -> None:
        self.group, self.device, self.bucket_bytes = group, device, bucket_bytes
        self.is_sender = group is not None and group.rank() == 0
        specs: list[Spec] | None = None
        if model is not None:
            specs = [
                (n, tuple(p.shape), wire_dtype if p.is_floating_point() else p.dtype)
                for n, p in model.named_parameters()
            ]
        if group is not None:
            specs = self._share(specs)
        self.buckets = plan_buckets(specs or [], bucket_bytes)

    def _share(self, specs: list[Spec] | None) -> list[Spec]:
        assert self.group is not None
        import pickle

        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        data = b""
        if self.is_sender:
            data = pickle.dumps(specs)
            size[0] = len(data)
        self.group.broadcast([size], dist.BroadcastOptions()).wait()
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.is_sender:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.group.broadcast([buf], dist.BroadcastOptions()).wait()
        shared: list[Spec] = pickle.loads(buf.cpu().numpy().tobytes())
        return shared

    @property
    def nbytes(self) -> int:
        return sum(_numel(s) * d.itemsize for b in self.buckets for _, s, d in b)

    def send(self, model: torch.nn.Module) -> int:
        """Actor ranks: gather every parameter; the sender broadcasts bucket by bucket. Returns bytes sent."""
        full = iter_full_weights(model, self.bucket_bytes)
        inflight: list[tuple[Any, torch.Tensor]] = []
        for bucket in self.buckets:
            flat = None
            if self.is_sender:
                flat = torch.empty(sum(_numel(s) for _, s, _ in bucket), dtype=bucket[0][2], device=self.device)
            offset = 0
            for name, shape, _ in bucket:
                got, t = next(full)
                if got != name:
                    raise RuntimeError(f"weight sync layout mismatch: expected {name}, got {got}")
                n = _numel(shape)
                if flat is not None:
                    flat[offset : offset + n].copy_(t.reshape(-1))
                offset += n
            if flat is not None:
                assert self.group is not None
                if len(inflight) >= 2:  # at most two buckets in flight
                    inflight.pop(0)[0].wait()
                inflight.append((self.group.broadcast([flat], dist.BroadcastOptions()), flat))
        for work, _ in inflight:
            work.wait()
        return self.nbytes if self.is_sender else 0

    def received(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Rollout ranks: (name, tensor) for every parameter, as the broadcasts arrive."""
        assert self.group is not None and not self.is_sender

        def post(i: int) -> tuple[Any, torch.Tensor]:
            b = self.buckets[i]
            flat = torch.empty(sum(_numel(s) for _, s, _ in b), dtype=b[0][2], device=self.device)
            return self.group.broadcast([flat], dist.BroadcastOptions()), flat  # type: ignore[union-attr]

        pending = post(0) if self.buckets else None
        for i, bucket in enumerate(self.buckets):
            assert pending is not None
            work, flat = pending
            work.wait()
            pending = post(i + 1) if i + 1 < len(self.buckets) else None
            offset = 0
            for name, shape, _ in bucket:
                n = _numel(shape)
                yield name, flat[offset : offset + n].view(shape)
                offset += n

    def receive(self, engine: RolloutEngine) -> int:
        """Rollout ranks: stream the broadcast into the engine's in-place reload. Returns bytes received."""
        engine.load_weights(self.received())
        return self.nbytes
