"""Weight-sync benchmark: the trainer -> vLLM weight sync against the raw collective of the same bytes (`worker`;
`plan_runs`); `ratio` = raw_s / sync_s (TARGET_RATIO).
"""

from __future__ import annotations

import argparse
import statistics
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import common
from benchmarks.common import SIZES, model_dir
from torchrl_post.config import load_config
from torchrl_post.distributed.env import read_env
from torchrl_post.distributed.placement import Topology, plan_placement
from torchrl_post.engines.base import RolloutEngine
from torchrl_post.sync.weights import BroadcastSync, iter_full_weights, param_specs, plan_wire, sync_weights
from torchrl_post.workers.actor import Actor

NAME = "sync"
TARGET_RATIO = 0.7
MODELS = ("qwen2-1m", "qwen2-10m", "qwen2-40m", "qwen2-100m")
BROADCAST_CURVES = (  # (key, label, style) of the broadcast panel's lines
    ("sync", "sync", "o-"), ("transfer", "transfer (no engine load)", "^-"), ("raw", "raw broadcast", "s--"),
)  # fmt: skip
GB = 1e9
COLUMNS = [
    ("mode", "mode", "{}"), ("actor", "actor", "{}"), ("rollout", "rollout", "{}"), ("model", "model", "{}"),
    ("params", "params", "{:,}"), ("MB", "MB", "{:.1f}"), ("sync ms", "sync_ms", "{:.1f}"),
    ("raw ms", "raw_ms", "{:.1f}"), ("transfer ms", "transfer_ms", "{:.1f}"), ("load ms", "load_ms", "{:.1f}"),
    ("sync GB/s", "sync_GBps", "{:.3f}"), ("raw GB/s", "raw_GBps", "{:.3f}"), ("ratio", "ratio", "{:.2f}"),
    ("transfer ratio", "transfer_ratio", "{:.2f}"), ("loadavg", "loadavg_1m", "{:.1f}"),
]  # fmt: skip
OPTIONS: common.Options = {
    "--repeats": {"type": int, "help": "timed repeats (default 3, --tiny 1)"},
    "--bucket-mb": {"type": int, "default": 64},
}


def plan_runs(args: argparse.Namespace) -> list[tuple[str, str, int, int]]:
    """(model, mode, actor ranks, rollout ranks) per launch."""
    if args.quick or args.tiny:
        return [(MODELS[0], "colocated", 2, 0), (MODELS[0], "broadcast", 1, 1)]
    runs = [(m, "colocated", 2, 0) for m in MODELS] + [(m, "broadcast", 1, 1) for m in MODELS]
    # scaling with receivers, then an FSDP gather over two actor ranks before the broadcast
    return runs + [(MODELS[-1], "broadcast", 1, 2), (MODELS[-1], "broadcast", 1, 3), (MODELS[-1], "broadcast", 2, 1)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.repeats = args.repeats or (1 if args.tiny else 3)
    runs = plan_runs(args)
    records: list[dict[str, Any]] = []
    for i, (model, mode, actor, rollout) in enumerate(runs, 1):
        tag = f"{model}_{mode}_a{actor}_r{rollout}"
        nproc = actor if mode == "colocated" else actor + rollout
        print(f"  [{i}/{len(runs)}] {tag} on {nproc} ranks ...", flush=True)
        worker_args = {
            "model": model_dir(SIZES[model]), "mode": mode, "actor": actor, "rollout": rollout,
            "bucket_mb": args.bucket_mb, "repeats": args.repeats,
        }  # fmt: skip
        rec = common.run_worker(f"sync_{tag}", "benchmarks.sync", nproc, worker_args)
        rec["transfer_ratio"] = rec["raw_s"] / rec["transfer_s"]
        records.append(rec)
        print(f"      sync {rec['sync_s'] * 1e3:.1f} ms, raw {rec['raw_s'] * 1e3:.1f} ms, ratio {rec['ratio']:.2f}")
    return {
        "quick": args.quick, "tiny": args.tiny, "repeats": args.repeats, "bucket_mb": args.bucket_mb,
        "target_ratio": TARGET_RATIO, "records": records, "loadavg_1m": common.load_1m(),
    }  # fmt: skip


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
    words = -(-bsync.nbytes // 4)  # the bytes as float32 words, rounded up
    flat = torch.ones(words, dtype=torch.float32, device=topo.env.device) if topo.sync is not None else None
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


def worker(argv: list[str]) -> None:
    """The framework's weight sync against the raw collective of the same bytes, one topology per launch."""
    args = common.worker_args(worker.__doc__, argv, model=Path, mode=str, actor=int, rollout=0, bucket_mb=64, repeats=3)
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


def markdown(rec: dict[str, Any]) -> str:
    rows = [
        {**r, **{f"{k}_ms": r[f"{k}_s"] * 1e3 for k in ("sync", "raw", "transfer", "load")}, "MB": r["bytes"] / 1e6}
        for r in rec["records"]
    ]
    return common.blocks(
        "# Weight-sync benchmark",
        f"{common.versions(rec)}. Median of {rec['repeats']} repeats; `transfer` is the sync path without the engine "
        "load, `load ms` the engine's reload alone; `loadavg`: the 1-minute load average at the end of the run.",
        common.table(rows, COLUMNS),
        f"Target: ratio = raw_s / sync_s of at least {rec['target_ratio']}, end to end (vLLM's reload included); "
        "`transfer ratio` = raw_s / transfer_s, up to the engine's loader. raw is the bare collective for the same "
        "bytes into buffers allocated once: the same bucketed all_gathers (colocated), one broadcast of all the bytes "
        "(disaggregated; with 2 actor ranks the sync also gathers the FSDP shards first). On 2 CPU cores the engine's "
        "reload cannot overlap the next bucket's broadcast as on a GPU.",
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    records = rec["records"]
    fig, (left, right) = common.subplots(1, 2, figsize=(12, 4.5))
    curves: list[common.Curve] = []
    for mode, label in (("colocated", "colocated (2 actor ranks)"), ("broadcast", "broadcast (1 actor -> 1 rollout)")):
        rs = [r for r in records if r["mode"] == mode and (mode == "colocated" or r["rollout"] == r["actor"] == 1)]
        rs.sort(key=lambda r: r["bytes"])
        xs, color = [r["bytes"] / 1e6 for r in rs], "C0" if mode == "colocated" else "C1"
        curves.append((f"{label}: sync", xs, [r["sync_GBps"] for r in rs], f"{color}o-"))
        curves.append((f"{label}: raw", xs, [r["raw_GBps"] for r in rs], f"{color}s--"))
    left.set(xscale="log", yscale="log", xlabel="model size (MB, float32)", ylabel="GB/s")
    common.lines(left, curves, "sync vs raw collective bandwidth")
    if bcast := [r for r in records if r["mode"] == "broadcast"]:
        biggest = max(r["bytes"] for r in bcast)
        rs = sorted((r for r in bcast if r["bytes"] == biggest and r["actor"] == 1), key=lambda r: r["rollout"])
        xs = [r["rollout"] for r in rs]
        curves = [(label, xs, [r[f"{key}_s"] for r in rs], style) for key, label, style in BROADCAST_CURVES]
        title = f"broadcast sync time, {rs[0]['model']} ({biggest / 1e6:.0f} MB)"
        common.lines(right, curves, title, xs, xlabel="rollout ranks", ylabel="seconds")
    common.save_figure(fig, path)


if __name__ == "__main__":
    common.standalone()
