"""Weight-sync speed, one topology per launch (torchrun on K ranks): the framework's sync against a raw collective.

colocated (K = N): `sync_weights` (bucketed all_gather streamed into vLLM's reload) against the same all_gathers
into buffers allocated once. broadcast (K = N + M, engines on ranks N..): `BroadcastSync.send/receive` against one
broadcast of one flat tensor of the same bytes. Both also time `transfer_s` (the sync path with no engine load) and
`load_s` (the engine's reload alone). Median of R repeats between barriers, the four taking turns.
"""

from __future__ import annotations

import statistics
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import common
from torchrl_post.config import load_config
from torchrl_post.distributed.env import read_env
from torchrl_post.distributed.placement import Topology, plan_placement
from torchrl_post.engines.base import RolloutEngine
from torchrl_post.sync.weights import BroadcastSync, iter_full_weights, param_specs, plan_wire, sync_weights
from torchrl_post.workers.actor import Actor

GB = 1e9


def timed(topo: Topology, fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each fn between barriers over every rank."""
    turns = common.take_turns(fns, repeats, lambda: barrier(topo))
    return {k: statistics.median(t[0] for t in ts) for k, ts in turns.items()}


def barrier(topo: Topology) -> None:
    if topo.world is not None:
        topo.world.barrier().wait()
    else:
        dist.barrier()


def drain(it: Iterator[tuple[str, torch.Tensor]]) -> None:
    for _ in it:
        pass


def checkpoint_weights(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """The model's weights as saved (HF names, full tensors), for timing the engine's reload on its own."""
    from safetensors.torch import load_file

    return [(n, t) for f in sorted(model_dir.glob("*.safetensors")) for n, t in load_file(f).items()]


def bench_colocated(topo: Topology, actor: Actor, engine: RolloutEngine, args: Any) -> dict[str, Any]:
    model, bucket_bytes, device = actor.model, args.bucket_mb << 20, topo.env.device
    # The raw collective: the same all_gathers (one per wire bucket, the same sizes) into buffers made once.
    buffers = [
        (torch.ones(b.slot, dtype=b.dtype, device=device), torch.empty(b.numel, dtype=b.dtype, device=device))
        for b in plan_wire(param_specs(model), bucket_bytes)
    ]
    full = checkpoint_weights(args.model)

    def raw() -> None:
        for send, recv in buffers:
            dist.all_gather_into_tensor(recv, send, group=actor.group)

    times = timed(topo, {
        "sync_s": lambda: sync_weights(model, engine, bucket_bytes),
        "raw_s": raw,
        "transfer_s": lambda: drain(iter_full_weights(model, bucket_bytes)),
        "load_s": lambda: engine.load_weights(iter(full)),
    }, args.repeats)  # fmt: skip
    params = list(model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in params)
    return {"params": sum(p.numel() for p in params), "bytes": nbytes, **times}


def bench_broadcast(topo: Topology, actor: Actor | None, engine: RolloutEngine | None, args: Any) -> dict[str, Any]:
    model = actor.model if actor is not None else None
    bsync = BroadcastSync(topo.sync, topo.env.device, args.bucket_mb << 20, torch.float32, model)
    flat = (
        torch.ones(-(-bsync.nbytes // 4), dtype=torch.float32, device=topo.env.device)
        if topo.sync is not None
        else None
    )
    stand_in = checkpoint_weights(args.model) if engine is not None else []
    # an actor rank sends either way; a rollout rank receives into the engine or just drains; others only wait
    send, skip = (lambda: bsync.send(model)) if model is not None else None, lambda: None
    times = timed(topo, {
        "sync_s": send or ((lambda: bsync.receive(engine)) if engine is not None else skip),
        "raw_s": (lambda: topo.sync.broadcast([flat], dist.BroadcastOptions()).wait()) if flat is not None else skip,
        "transfer_s": send or (lambda: drain(bsync.received())),
        "load_s": (lambda: engine.load_weights(iter(stand_in))) if engine is not None else skip,
    }, args.repeats)  # fmt: skip
    params = sum(p.numel() for p in model.parameters()) if model is not None else 0  # global rank 0 is an actor rank
    return {"params": params, "bytes": bsync.nbytes, **times}


def main() -> None:
    args = common.worker_args(__doc__, model=Path, mode=str, actor=int, rollout=0, bucket_mb=64, repeats=3)
    env = read_env("auto")  # cuda (nccl) where there is one, else cpu (gloo)
    cfg = load_config([
        f"model.path={args.model.resolve()}", "data.train_files=unused.jsonl", "data.val_files=null",
        "data.max_prompt_length=16", "data.max_response_length=8", "rollout.engine=vllm", "rollout.max_num_seqs=8",
        "rollout.cpu_kvcache_space_gb=1", f"rollout.sync_bucket_mb={args.bucket_mb}", "trainer.device=auto",
    ])  # fmt: skip
    colocated = args.mode == "colocated"
    want = args.actor if colocated else args.actor + args.rollout
    if env.world_size != want:
        raise SystemExit(f"{args.mode} with actor={args.actor} rollout={args.rollout} needs {want} ranks")
    rollout = "actor" if colocated else list(range(args.actor, want))
    spec = types.SimpleNamespace(
        actor=list(range(args.actor)), rollout=rollout, critic=None, reference=None, reward_model=None
    )
    topo = Topology(plan_placement(spec, env.world_size), env, {"actor": -1})
    torch.manual_seed(0)
    actor: Actor | None = None
    if topo.has("actor"):
        actor = common.build_actor(cfg, topo.mesh("actor"), env.device, temperature=cfg.rollout.temperature)
    engine = common.build_engine(cfg, env.device, env.rank) if topo.has("rollout") else None
    try:
        if colocated:
            assert actor is not None and engine is not None
            r = bench_colocated(topo, actor, engine, args)
        else:
            r = bench_broadcast(topo, actor, engine, args)
        if env.rank == 0:
            rollout_ranks = args.actor if colocated else args.rollout
            common.write_json(args.out, {
                "mode": args.mode, "actor": args.actor, "rollout": rollout_ranks, "world": env.world_size,
                "bucket_mb": args.bucket_mb, "repeats": args.repeats, "model": args.model.name, **r,
                "sync_GBps": r["bytes"] / r["sync_s"] / GB, "raw_GBps": r["bytes"] / r["raw_s"] / GB,
                "ratio": r["raw_s"] / r["sync_s"],
            })  # fmt: skip
        barrier(topo)
    finally:
        if engine is not None:
            engine.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
