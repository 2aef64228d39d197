"""Weight-sync speed, one topology per launch: the framework's sync against a raw collective of the same bytes.

    torchrun --standalone --nproc-per-node K benchmarks/sync_worker.py \
        --model DIR --mode {colocated,broadcast} --actor N --rollout M --bucket-mb B --repeats R --out FILE

colocated (K = N): actor (FSDP2) and vLLM engine on the same N ranks. Timed: `sync_weights` (bucketed
    all_gather of the shards, streamed into vLLM's in-place reload) against the same all_gathers (one per
    wire bucket, the same sizes) into buffers allocated once: the raw collective for the same bytes.
broadcast (K = N + M): actor on ranks 0..N-1, engines on N..N+M-1. Timed: `BroadcastSync.send/receive`
    (gather, bucketed broadcast of the gathered buffers, reload) against one broadcast of one flat tensor of the same bytes
    over the sync group.

Both also time the two halves of the sync apart: `transfer_s` (the sync path with no engine load) and
`load_s` (the engine's reload from tensors already in memory). Every timed region is bracketed by a barrier
over all ranks, warmed up once, and the median of R repeats (taken on global rank 0) is reported; the four
take turns within each repeat, so outside load on the CPUs skews them alike. Rank 0 writes one JSON record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from torchrl_post.config import load_config
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import DistEnv, read_env
from torchrl_post.distributed.placement import Topology, plan_placement
from torchrl_post.engines.base import RolloutEngine
from torchrl_post.engines.build import build_engine
from torchrl_post.plan import engine_spec
from torchrl_post.sync.weights import BroadcastSync, iter_full_weights, param_specs, plan_wire, sync_weights
from torchrl_post.workers.actor import Actor

GB = 1e9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--mode", required=True, choices=("colocated", "broadcast"))
    ap.add_argument("--actor", required=True, type=int, help="actor ranks")
    ap.add_argument("--rollout", type=int, default=0, help="rollout ranks (broadcast mode)")
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def build_config(model: Path, bucket_mb: int) -> Config:
    """A full Config for the actor and a small vLLM engine (data files are never read here)."""
    return load_config(
        [
            f"model.path={model.resolve()}",
            "data.train_files=unused.jsonl",
            "data.val_files=null",
            "data.max_prompt_length=16",
            "data.max_response_length=8",
            "rollout.engine=vllm",
            "rollout.max_num_seqs=8",
            "rollout.cpu_kvcache_space_gb=1",
            f"rollout.sync_bucket_mb={bucket_mb}",
            "trainer.device=auto",
        ]
    )


def build_topology(args: argparse.Namespace, env: DistEnv) -> Topology:
    actor = list(range(args.actor))
    rollout: list[int] | str = (
        "actor" if args.mode == "colocated" else list(range(args.actor, args.actor + args.rollout))
    )
    want = args.actor if args.mode == "colocated" else args.actor + args.rollout
    if env.world_size != want:
        raise SystemExit(
            f"{args.mode} with actor={args.actor} rollout={args.rollout} needs {want} ranks, got {env.world_size}"
        )
    spec = types.SimpleNamespace(actor=actor, rollout=rollout, critic=None, reference=None, reward_model=None)
    return Topology(plan_placement(spec, env.world_size), env, {"actor": -1})


def build_engine_for(cfg: Config, env: DistEnv) -> RolloutEngine:
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    return build_engine(
        cfg.model,
        cfg.rollout,
        engine_spec(cfg, device=env.device.type),
        env.device,
        env.rank,
        tok.pad_token_id,
        [tok.eos_token_id],
    )


def barrier_all(topo: Topology) -> None:
    if topo.world is not None:
        topo.world.barrier().wait()
    else:
        dist.barrier()


def timed(topo: Topology, fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each fn between barriers over every rank, after one warm-up call each.

    The fns take turns within every repeat, so load from outside the benchmark hits them alike.
    """
    for fn in fns.values():
        barrier_all(topo)
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            barrier_all(topo)
            t0 = time.perf_counter()
            fn()
            barrier_all(topo)
            times[key].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def param_stats(model: torch.nn.Module) -> tuple[int, int]:
    """(parameters, bytes) of the full (unsharded) model."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def drain(it: Iterator[tuple[str, torch.Tensor]]) -> None:
    for _ in it:
        pass


def checkpoint_weights(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """The model's weights as saved (HF names, full tensors), for timing the engine's reload on its own."""
    from safetensors.torch import load_file

    return [(n, t) for f in sorted(model_dir.glob("*.safetensors")) for n, t in load_file(f).items()]


# ---- colocated ---------------------------------------------------------------------------------------------


def bench_colocated(topo: Topology, actor: Actor, engine: RolloutEngine, args: argparse.Namespace) -> dict[str, Any]:
    model, bucket_bytes, device = actor.model, args.bucket_mb << 20, topo.env.device
    params, nbytes = param_stats(model)
    # The raw collective: the same all_gathers (one per wire bucket, the same sizes) into buffers made once.
    buffers = [
        (torch.ones(b.slot, dtype=b.dtype, device=device), torch.empty(b.numel, dtype=b.dtype, device=device))
        for b in plan_wire(param_specs(model), bucket_bytes)
    ]
    full = checkpoint_weights(args.model)

    def raw() -> None:
        for send, recv in buffers:
            dist.all_gather_into_tensor(recv, send, group=actor.group)

    fns: dict[str, Callable[[], Any]] = {
        "sync_s": lambda: sync_weights(model, engine, bucket_bytes),
        "raw_s": raw,
        "transfer_s": lambda: drain(iter_full_weights(model, bucket_bytes)),
        "load_s": lambda: engine.load_weights(iter(full)),
    }
    times = timed(topo, fns, args.repeats)
    return {"params": params, "bytes": nbytes, **times}


# ---- broadcast ---------------------------------------------------------------------------------------------


def raw_broadcast(topo: Topology, flat: torch.Tensor | None) -> None:
    if topo.sync is not None and flat is not None:
        topo.sync.broadcast([flat], dist.BroadcastOptions()).wait()


def bench_broadcast(
    topo: Topology, actor: Actor | None, engine: RolloutEngine | None, args: argparse.Namespace
) -> dict[str, Any]:
    bsync = BroadcastSync(
        topo.sync, topo.env.device, args.bucket_mb << 20, torch.float32, actor.model if actor is not None else None
    )
    flat = (
        torch.ones(-(-bsync.nbytes // 4), dtype=torch.float32, device=topo.env.device)
        if topo.sync is not None
        else None
    )
    stand_in = checkpoint_weights(args.model) if engine is not None else []

    def sync() -> None:
        if actor is not None:
            bsync.send(actor.model)
        elif engine is not None:
            bsync.receive(engine)

    def transfer() -> None:
        if actor is not None:
            bsync.send(actor.model)
        else:
            drain(bsync.received())

    def load() -> None:
        if engine is not None:
            engine.load_weights(iter(stand_in))

    fns = {"sync_s": sync, "raw_s": lambda: raw_broadcast(topo, flat), "transfer_s": transfer, "load_s": load}
    times = timed(topo, fns, args.repeats)
    params = param_stats(actor.model)[0] if actor is not None else 0  # global rank 0 is an actor rank
    return {"params": params, "bytes": bsync.nbytes, **times}


# ---- main --------------------------------------------------------------------------------------------------


def record(args: argparse.Namespace, env: DistEnv, r: dict[str, Any]) -> dict[str, Any]:
    return {
        "mode": args.mode,
        "actor": args.actor,
        "rollout": args.rollout if args.mode == "broadcast" else args.actor,
        "world": env.world_size,
        "bucket_mb": args.bucket_mb,
        "repeats": args.repeats,
        "model": args.model.name,
        **r,
        "sync_GBps": r["bytes"] / r["sync_s"] / GB,
        "raw_GBps": r["bytes"] / r["raw_s"] / GB,
        "ratio": r["raw_s"] / r["sync_s"],
    }


def run(args: argparse.Namespace) -> None:
    env = read_env("auto")  # cuda (nccl) where there is one, else cpu (gloo)
    cfg = build_config(args.model, args.bucket_mb)
    topo = build_topology(args, env)
    torch.manual_seed(0)
    actor = (
        Actor(
            cfg.model,
            cfg.actor,
            topo.mesh("actor"),
            env.device,
            temperature=cfg.rollout.temperature,
            mini_batch_samples=1,
            micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu,
            max_response_length=cfg.data.max_response_length,
            total_steps=1,
        )
        if topo.has("actor")
        else None
    )
    engine = build_engine_for(cfg, env) if topo.has("rollout") else None
    try:
        if args.mode == "colocated":
            assert actor is not None and engine is not None
            result = bench_colocated(topo, actor, engine, args)
        else:
            result = bench_broadcast(topo, actor, engine, args)
        if env.rank == 0:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record(args, env, result), indent=1) + "\n")
        barrier_all(topo)
    finally:
        if engine is not None:
            engine.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    run(parse_args())
