"""Weight sync, trainer -> rollout engine: FSDP2 shards gathered bucket by bucket, in HF names.

A `WireBucket` is the unit of both paths: consecutive parameters of one dtype, sharded over the same
number of ranks, up to `bucket_bytes` in full. Its flat buffer is rank-major (each rank's padded slot of
every parameter, one after the other), which is what one all_gather over the FSDP group produces, so:
- colocated: every actor rank gathers a bucket and hands the full tensors (views into it) to its engine;
- disaggregated: the actor ranks gather, and the first actor rank broadcasts the gathered buffer as is to
  the rollout ranks (no repacking), which cut it into parameters while their engine loads the previous one.
Floating tensors are cast to the wire dtype while they are copied into the send buffer (free), so a bf16
engine halves the bytes gathered and sent. Every rank must walk the buckets in the same order (collectives).

Tied word embeddings (`tie_word_embeddings`: the output embedding *is* the input embedding's parameter) move once,
under the embedding's name, and reach the engine under both names (`tied_aliases`): `named_parameters()` lists a
shared parameter once, and an engine whose LM head is a layer of its own (vLLM) reloads only the layers it is
sent, so a stream without `lm_head.weight` would leave its LM head on the old weights.
"""

from __future__ import annotations

import pickle
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from torchrl_post.distributed.env import RawGroup
from torchrl_post.engines.base import RolloutEngine
from torchrl_post.workers.expert_parallel import lora_wrappers, with_lora
from torchrl_post.workers.loading import expert_pieces

Entry = tuple[str, tuple[int, ...], int, int]  # name, full shape, rows per rank slot, elements per rank slot
ParamSpec = tuple[str, tuple[int, ...], torch.dtype, int]  # name, full shape, dtype on the wire, shard ranks


Keep = Callable[[str], bool]
"""Which parameters a sync moves, by name (a LoRA run in adapter mode: the adapter's only)."""


@dataclass(frozen=True)
class WireBucket:
    dtype: torch.dtype
    world: int  # rank slots: the FSDP shard group size, 1 for unsharded parameters
    entries: tuple[Entry, ...]

    @property
    def slot(self) -> int:
        return sum(n for *_, n in self.entries)

    @property
    def numel(self) -> int:
        return self.world * self.slot

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def _rows_per_rank(dim0: int, world: int) -> int:
    return -(-dim0 // world)  # DTensor Shard(0) follows torch.chunk: ceil-sized chunks, short tail


def plan_wire(specs: list[ParamSpec], bucket_bytes: int) -> list[WireBucket]:
    """Group parameters, in order, into buckets of one dtype and shard world, at most `bucket_bytes` in full
    (a larger parameter alone). Pure: every rank computes the same plan from the same specs."""
    buckets: list[WireBucket] = []
    cur: list[Entry] = []
    key: tuple[torch.dtype, int] | None = None
    size = 0
    for name, shape, dtype, world in specs:
        dim0 = shape[0] if shape else 1
        rows = _rows_per_rank(dim0, world)
        per_row = 1
        for d in shape[1:]:
            per_row *= d
        n = rows * per_row
        full = world * n * dtype.itemsize
        if cur and ((dtype, world) != key or size + full > bucket_bytes):
            assert key is not None
            buckets.append(WireBucket(key[0], key[1], tuple(cur)))
            cur, size = [], 0
        cur.append((name, shape, rows, n))
        key, size = (dtype, world), size + full
    if cur:
        assert key is not None
        buckets.append(WireBucket(key[0], key[1], tuple(cur)))
    return buckets


def _shard_group(p: torch.Tensor) -> dist.ProcessGroup | None:
    """The group to gather over for FSDP (Shard(0) on a 1-D mesh) and HSDP (Replicate, Shard(0)) params."""
    if not isinstance(p, DTensor) or p.placements[-1] != Shard(0):
        return None
    if not all(pl.is_replicate() for pl in p.placements[:-1]):
        return None
    return p.device_mesh.get_group(p.device_mesh.ndim - 1)


def param_specs(
    model: torch.nn.Module, wire_dtype: torch.dtype | None = None, keep: Keep | None = None
) -> list[ParamSpec]:
    """(HF name, full shape, dtype on the wire, shard ranks) of every parameter (`keep`: those it accepts); an
    expert-parallel parameter as its experts' checkpoint tensors (`ExpertBlocks`), each whole on one rank slot."""
    specs = []
    blocks = expert_blocks(model)
    pieces = blocks.pieces
    for name, p in model.named_parameters():
        if (keep is not None and not keep(name)) or name in blocks.replaced:
            continue
        dtype = wire_dtype if wire_dtype is not None and p.is_floating_point() else p.dtype
        if name in pieces:
            specs += [(piece, shape, dtype, 1) for piece, shape in pieces[name]]
            continue
        group = _shard_group(p)
        specs.append((name, tuple(p.shape), dtype, 1 if group is None else dist.get_world_size(group)))
    return specs


class ExpertBlocks:
    """An expert-parallel model's experts for the sync at O(E / ep) memory, as verl's #6612 keeps it.

    A fused experts parameter sharded by expert over ep (`workers/expert_parallel.py: shard_experts`) leaves as its
    experts' checkpoint tensors (`expert_checkpoint_names`: `...experts.{e}.gate_proj.weight`, ...), the names every
    engine loads a checkpoint by. They are made one ep block at a time: each rank gathers its own block (its E / ep
    experts) over efsdp, then each ep rank's block in turn is broadcast over the ep group. A rank holds at most its
    own block and one other, never the whole [E, ...] tensor. Every actor rank walks the pieces in the same order
    (the gathers and broadcasts are collectives). Parameters without a per-expert checkpoint layout (transposed
    experts) are gathered whole. A LoRA model's adapted experts leave merged: each block gets its experts' share of
    the adapters' update (`with_lora`, as the forward adds it), and the experts' adapters are not sent."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = dict(model.named_parameters())
        sharded = {n for n, p in self.params.items() if _expert_parallel(p)}
        self.where = {k: v for k, v in expert_pieces(model).items() if v[0] in sharded} if sharded else {}
        """piece -> (parameter, expert, part, parts), in the parameter's expert-major, part order"""
        self.pieces: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        """each expert-parallel parameter -> its pieces (checkpoint name, shape), in the order they are sent"""
        for piece, (name, _, _, parts) in self.where.items():
            shape = self.params[name].shape
            self.pieces.setdefault(name, []).append((piece, (shape[1] // parts, *shape[2:])))
        self.lora: dict[str, Any] = {}
        """a LoRA model's expert-parallel parameter -> PEFT's wrapper of it (its pieces leave merged)"""
        self.replaced: set[str] = set()
        """those wrappers' adapter parameters: their update is in the pieces, so they are not sent"""
        names = {id(p): n for n, p in self.params.items()}
        for name in self.pieces:
            owner, attr = name.rsplit(".", 1)
            wrapper = lora_wrappers(model, model.get_submodule(owner))[0].get(attr)
            if wrapper is not None:
                self.lora[name] = wrapper
                adapters = [*wrapper.lora_A.values(), *wrapper.lora_B.values()]
                self.replaced |= {names[id(m.weight)] for m in adapters if id(m.weight) in names}
        self._own: tuple[str, torch.Tensor] | None = None
        self._block: tuple[str, int, torch.Tensor] | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def piece(self, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The checkpoint tensor `name`, a view into the current ep block (made when first asked for)."""
        param, expert, part, parts = self.where[name]
        p = self.params[param]
        assert isinstance(p, DTensor)
        per = _experts_per_rank(p)
        owner = expert // per
        if self._block is None or self._block[:2] != (param, owner):
            self._block = None  # freed before the next is made
            self._block = (param, owner, self._broadcast(param, p, owner, device, dtype))
        return self._block[2][expert - owner * per].chunk(parts)[part]

    def _own_block(self, param: str, p: DTensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """This rank's E / ep experts of `p`, whole: its FSDP shard gathered over efsdp (torch.chunk rows)."""
        if self._own is not None and self._own[0] == param:
            return self._own[1]
        self._own = None
        local = p.to_local().detach()
        group = p.device_mesh.get_group("efsdp")
        world = dist.get_world_size(group)
        if world == 1:
            own = local.to(device=device, dtype=dtype)
        else:
            rows = _experts_per_rank(p)
            per_rank = _rows_per_rank(rows, world)
            send = torch.zeros((per_rank, *local.shape[1:]), dtype=dtype, device=device)
            send[: local.shape[0]].copy_(local)
            recv = torch.empty((world * per_rank, *local.shape[1:]), dtype=dtype, device=device)
            dist.all_gather_into_tensor(recv, send, group=group)
            own = recv[:rows]
        self._own = (param, own)
        return own

    def _broadcast(self, param: str, p: DTensor, owner: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Ep rank `owner`'s block of `p` on every rank of the ep group."""
        own = self._own_block(param, p, device, dtype)
        mesh = p.device_mesh
        if mesh.get_local_rank("ep") == owner:
            block = own
        else:
            block = torch.empty_like(own)
        dist.broadcast(block, group=mesh.get_group("ep"), group_src=owner)
        wrapper = self.lora.get(param)
        if wrapper is not None:  # merged here, in float32, as the engine merges the other adapted layers
            block = with_lora(block.float(), wrapper, owner * _experts_per_rank(p), _whole).to(block.dtype)
        return block


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A LoRA adapter's matrix whole: gathered over the dense mesh (a collective: every actor rank, in order)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _experts_per_rank(p: DTensor) -> int:
    """E / ep: the experts of `p` each rank of its ep group keeps."""
    names = p.device_mesh.mesh_dim_names or ()
    return p.shape[0] // p.device_mesh.size(names.index("ep"))


def _expert_parallel(p: torch.Tensor) -> bool:
    """A parameter sharded by expert over an ep mesh dim (`workers/expert_parallel.py: shard_experts`)."""
    return isinstance(p, DTensor) and "ep" in (p.device_mesh.mesh_dim_names or ())


def _local_or_full(p: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value on this rank without a gather where possible (unsharded, or one shard)."""
    if not isinstance(p, DTensor):
        return p
    group = _shard_group(p)
    if group is not None and dist.get_world_size(group) == 1:
        return p.to_local()
    return p.full_tensor()


def gather_bucket(
    bucket: WireBucket, params: Mapping[str, torch.Tensor], device: torch.device, experts: ExpertBlocks | None = None
) -> torch.Tensor:
    """This bucket's flat, rank-major buffer: one all_gather over the shard group (none for world 1); the pieces
    of expert-parallel parameters from `experts`."""
    send = torch.empty(bucket.slot, dtype=bucket.dtype, device=device)
    offset = 0
    for name, _, _, n in bucket.entries:
        if experts is not None and name in experts:
            local = experts.piece(name, device, bucket.dtype)
        else:
            p = params[name].detach()
            local = p.to_local() if isinstance(p, DTensor) and bucket.world > 1 else _local_or_full(p)
        flat = local.reshape(-1)
        send[offset : offset + flat.numel()].copy_(flat)  # casts to the wire dtype
        send[offset + flat.numel() : offset + n].zero_()  # the short last shard's padding
        offset += n
    if bucket.world == 1:
        return send
    group = _shard_group(params[bucket.entries[0][0]])
    assert group is not None
    recv = torch.empty(bucket.numel, dtype=bucket.dtype, device=device)
    dist.all_gather_into_tensor(recv, send, group=group)
    return recv


def split_bucket(flat: torch.Tensor, bucket: WireBucket) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every parameter of a gathered buffer; views when there is one rank slot."""
    offset, slot = 0, bucket.slot
    for name, shape, rows, n in bucket.entries:
        numel = 1
        for d in shape:
            numel *= d
        if bucket.world == 1:
            yield name, flat[offset : offset + numel].view(shape)
        else:
            dim0 = shape[0] if shape else 1
            per_row = n // rows if rows else 0
            parts = []
            for r in range(bucket.world):
                have = max(0, min(rows, dim0 - r * rows))
                start = r * slot + offset
                parts.append(flat[start : start + have * per_row])
            yield name, torch.cat(parts).view(shape)
        offset += n


_BLOCKS: weakref.WeakKeyDictionary[torch.nn.Module, ExpertBlocks] = weakref.WeakKeyDictionary()


def expert_blocks(model: torch.nn.Module) -> ExpertBlocks:
    """The model's `ExpertBlocks`, built once: it walks every module (and with LoRA, each adapted expert's
    wrappers), while its parameters stay the same objects from one sync to the next."""
    if model not in _BLOCKS:
        _BLOCKS[model] = ExpertBlocks(model)
    return _BLOCKS[model]


def iter_full_weights(
    model: torch.nn.Module,
    bucket_bytes: int,
    keep: Keep | None = None,
    wire_dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every parameter (`keep`: those it accepts), gathered in buckets of about
    `bucket_bytes` on `device` (default: where the parameters are), floating ones cast to `wire_dtype` (default:
    their own). Each bucket is handed on before the next is gathered. With CPU-offloaded shards
    (`fsdp.offload_policy`) and an accelerator `device`, each shard is copied up and cast as it is packed, and
    the gather runs on the accelerator's backend, not on the CPU's."""
    params = dict(model.named_parameters())
    device = device or next(iter(params.values())).device
    experts = expert_blocks(model)
    for bucket in plan_wire(param_specs(model, wire_dtype, keep), bucket_bytes):
        yield from split_bucket(gather_bucket(bucket, params, device, experts), bucket)


Alias = tuple[str, str]  # (another name of a parameter, the name `named_parameters()` lists it under)


def tied_aliases(model: torch.nn.Module, keep: Keep | None = None) -> tuple[Alias, ...]:
    """(alias, source) for tied word embeddings: the output embedding's weight when it is the input embedding's
    parameter (`tie_word_embeddings`), under every name but the one `named_parameters()` gives it (HF:
    ("lm_head.weight", "model.embed_tokens.weight"); PEFT-wrapped: the same under `base_model.model.`). Read
    from the model itself, so it holds for any architecture and under FSDP2, which keeps the tie."""
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if not callable(get_in) or not callable(get_out):
        return ()
    emb_in, emb_out = get_in(), get_out()
    weight = getattr(emb_in, "weight", None)
    if weight is None or emb_out is None or getattr(emb_out, "weight", None) is not weight:
        return ()
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is weight]
    if keep is not None and not keep(names[0]):
        return ()
    return tuple((alias, names[0]) for alias in names[1:])


def with_aliases(
    weights: Iterable[tuple[str, torch.Tensor]], aliases: tuple[Alias, ...]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream with each alias right after its source, the same tensor (nothing more is gathered or sent)."""
    by_source: dict[str, list[str]] = {}
    for alias, source in aliases:
        by_source.setdefault(source, []).append(alias)
    for name, tensor in weights:
        yield name, tensor
        for alias in by_source.get(name, ()):
            yield alias, tensor


def sync_weights(
    model: torch.nn.Module,
    engine: RolloutEngine,
    bucket_bytes: int,
    keep: Keep | None = None,
    wire_dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> int:
    """Push the actor's current weights into the colocated engine (tied embeddings under both names), in the
    engine's dtype where given, gathered on `device`; returns the bytes moved."""
    moved = 0

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal moved
        for name, t in iter_full_weights(model, bucket_bytes, keep, wire_dtype, device):
            moved += t.numel() * t.element_size()
            yield name, t

    engine.load_weights(with_aliases(counted(), tied_aliases(model, keep)))
    return moved


class ReloadSync:
    """Colocated weight push: every actor rank gathers the buckets and reloads its own engine in place."""

    def __init__(
        self,
        engine: RolloutEngine,
        bucket_bytes: int,
        keep: Keep | None = None,
        wire_dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        """`wire_dtype`: the engine's (floating weights are cast as they are packed: a bf16 engine halves the
        bytes gathered); `device`: where to gather (the rank's accelerator, also for CPU-offloaded shards)."""
        self.engine, self.bucket_bytes, self.keep = engine, bucket_bytes, keep
        self.wire_dtype, self.device = wire_dtype, device

    def push(self, model: torch.nn.Module) -> int:
        return sync_weights(model, self.engine, self.bucket_bytes, self.keep, self.wire_dtype, self.device)


class BroadcastSync:
    """Weight sync over the `sync` group ({first actor rank} + rollout ranks, rank 0 the sender).

    Every actor rank calls `send` (the gathers are collectives over the actor mesh); the first actor rank
    broadcasts each gathered bucket asynchronously (two in flight) while the next is gathered. Rollout ranks
    post the broadcast of bucket k+1 before their engine loads bucket k. The plan goes over once, at
    construction, with the tied-embedding aliases (`tied_aliases`: the receivers hand the embedding to their
    engine under both names; its bytes go over once); actor ranks outside the group only gather. With a `store`
    the sender announces each update there as it starts (`weights_sent/<n>`), which rollout.update_on_arrival's
    receivers poll (`incoming`) instead of a posted receive.
    """

    def __init__(
        self,
        group: RawGroup | None,
        device: torch.device,
        bucket_bytes: int,
        wire_dtype: torch.dtype,
        model: torch.nn.Module | None = None,
        keep: Keep | None = None,
        store: dist.Store | None = None,
    ) -> None:
        self.group, self.device, self.store = group, device, store
        self.updates = 0
        """Updates sent (the sender) or taken (the receivers) so far: the next one's announcement key."""
        self.is_sender = group is not None and group.rank() == 0
        plan: tuple[list[WireBucket], tuple[Alias, ...]] | None = None
        if model is not None:
            plan = plan_wire(param_specs(model, wire_dtype, keep), bucket_bytes), tied_aliases(model, keep)
        if group is not None:
            plan = self._share(plan)
        self.buckets, self.aliases = plan or ([], ())

    def _share(
        self, plan: tuple[list[WireBucket], tuple[Alias, ...]] | None
    ) -> tuple[list[WireBucket], tuple[Alias, ...]]:
        assert self.group is not None
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        data = pickle.dumps(plan) if self.is_sender else b""
        size[0] = len(data)
        self.group.broadcast([size], dist.BroadcastOptions()).wait()
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.is_sender:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.group.broadcast([buf], dist.BroadcastOptions()).wait()
        shared: tuple[list[WireBucket], tuple[Alias, ...]] = pickle.loads(buf.cpu().numpy().tobytes())
        return shared

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def send(self, model: torch.nn.Module) -> int:
        """Actor ranks: gather every bucket; the sender broadcasts each. Returns the bytes sent (0 elsewhere)."""
        params, experts = dict(model.named_parameters()), expert_blocks(model)
        if self.is_sender and self.store is not None:
            self.store.set(self._announcement(), "1")  # before the first bucket is even gathered
        self.updates += 1
        inflight: list[tuple[Any, torch.Tensor]] = []
        for bucket in self.buckets:
            flat = gather_bucket(bucket, params, self.device, experts)
            if not self.is_sender:
                continue
            assert self.group is not None
            if len(inflight) >= 2:
                inflight.pop(0)[0].wait()
            inflight.append((self.group.broadcast([flat], dist.BroadcastOptions()), flat))
        for work, _ in inflight:
            work.wait()
        return self.nbytes if self.is_sender else 0

    push = send

    def received(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Rollout ranks: (name, tensor) for every parameter, as the broadcasts arrive (tied embeddings under
        both names)."""
        self.updates += 1
        return with_aliases(self._received(), self.aliases)

    def _announcement(self) -> str:
        return f"weights_sent/{self.updates}"

    def incoming(self) -> Incoming:
        """Rollout ranks: the next update, polled (`Incoming.arrived`) while the engine keeps generating, then
        streamed as `received` does (`Incoming.weights()`). Its announcement in the store is polled, not a posted
        receive: a receive posted through the whole actor update would hold the GPU's SMs with an NCCL kernel (and
        time out with the group after an update longer than its timeout)."""
        assert self.store is not None, "rollout.update_on_arrival polls the sender's announcement in the store"
        store, key = self.store, self._announcement()
        return Incoming(lambda: bool(store.check([key])), self.received)

    def _post(self, i: int) -> tuple[Any, torch.Tensor]:
        assert self.group is not None and not self.is_sender
        flat = torch.empty(self.buckets[i].numel, dtype=self.buckets[i].dtype, device=self.device)
        return self.group.broadcast([flat], dist.BroadcastOptions()), flat

    def _received(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Bucket by bucket, each receive posted before the previous bucket is handed on."""
        pending = self._post(0) if self.buckets else None
        for i, bucket in enumerate(self.buckets):
            assert pending is not None
            work, flat = pending
            work.wait()
            pending = self._post(i + 1) if i + 1 < len(self.buckets) else None
            yield from split_bucket(flat, bucket)

    def receive(self, engine: RolloutEngine) -> int:
        """Rollout ranks: stream the broadcast into the engine's in-place reload. Returns bytes received."""
        engine.load_weights(self.received())
        return self.nbytes


class Incoming:
    """The next update of a `BroadcastSync` (`incoming`): announced yet, and its weights."""

    def __init__(
        self, announced: Callable[[], bool], receive: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    ) -> None:
        self._announced, self._receive = announced, receive

    def arrived(self) -> bool:
        """The sender has started the update: taking it blocks no longer than the gathers and the transfer."""
        return self._announced()

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._receive()
