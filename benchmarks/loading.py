"""Loading benchmark: peak host memory per rank while the actor loads, `model.load_format=sharded` against full
(`worker`; SETTINGS); the full load runs only where MemAvailable holds a copy of the model per rank.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import common
from benchmarks.common import SIZES, ModelSize, model_dir
from torchrl_post.distributed.env import end_process
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.workers.actor import local_bytes

NAME = "loading"
BIG = ModelSize("qwen2-1b", 2048, 22, 32, 8, 5632)  # 22 x 45.1M + embeddings: 0.99B parameters
SETTINGS: dict[str, tuple[ModelSize, tuple[int, ...]]] = {
    "full": (BIG, (1, 2, 4)),
    "quick": (SIZES["qwen2-100m"], (1, 2, 4)),
    "tiny": (SIZES["qwen2-1m"], (2,)),
}
COLUMNS = [
    ("model", "model", "{}"), ("format", "format", "{}"), ("ranks", "ranks", "{}"), ("model MB", "model_mb", "{:.0f}"),
    ("peak MB/rank", "peak_mb", "{:.0f}"), ("ratio", "ratio", "{:.3f}"), ("ideal", "ideal", "{:.3f}"),
    ("above model/ranks MB", "excess_mb", "{:.0f}"), ("resident after MB/rank", "after_mb", "{:.0f}"),
    ("load s", "seconds", "{:.1f}"),
]  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode(args)
    size, wanted = SETTINGS[mode]
    path = model_dir(size)
    model_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    rows, skipped = [], []
    for fmt in ("sharded", "full"):
        for ranks in wanted:
            if fmt == "full" and ranks * model_bytes * 1.3 > common.mem_available():
                skipped.append(f"full on {ranks} ranks ({ranks} x {model_bytes / 1e9:.1f} GB > MemAvailable)")
                continue
            tag = f"loading_{path.name}_{fmt}_r{ranks}"
            rec = common.run_worker(tag, "benchmarks.loading", ranks, {"model": path, "format": fmt})
            per, peak = rec["per_rank"], max(r["peak_growth_bytes"] for r in rec["per_rank"])
            rows.append({
                "model": size.name, **{k: rec[k] for k in ("format", "ranks", "num_params", "model_bytes")},
                "peak_rank": peak, "after_rank": max(r["after_bytes"] for r in per),
                "shard_rank": max(r["shard_bytes"] for r in per), "ratio": peak / rec["model_bytes"], "ideal": 1 / ranks,
                "excess_mb": (peak - rec["model_bytes"] / ranks) / 1e6, "seconds": max(r["seconds"] for r in per),
            })  # fmt: skip
            print(f"  {size.name} {fmt} on {ranks} rank(s): ratio {rows[-1]['ratio']:.3f} (ideal {1 / ranks:.3f})")
    return {"mode": mode, "rows": rows, "skipped": skipped, "loadavg_1m": common.load_1m()}


def rss_kb() -> int:
    rss = common.proc_field("/proc/self/status", "VmRSS:")
    return int(rss.split()[0]) if rss else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker(argv: list[str]) -> None:
    """One actor loaded by `model.load_format`: this rank's high-water RSS growth (`ru_maxrss`) over the load."""
    torch.set_num_threads(1)
    args = common.worker_args(worker.__doc__, argv, model=str, format=str)
    env, cfg = common.worker_init("auto", args.model)
    cfg.model.load_format = args.format
    mesh = fsdp_mesh(env.device.type, env.world_size, -1)
    dist.barrier()
    before = rss_kb()
    t0 = time.perf_counter()
    actor = common.build_actor(cfg, mesh, env.device)
    dist.barrier()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    params = list(actor.model.parameters())
    mine = {
        "rank": env.rank, "peak_growth_bytes": (peak - before) * 1024, "after_bytes": (rss_kb() - before) * 1024,
        "shard_bytes": sum(map(local_bytes, params)), "seconds": seconds,
    }  # fmt: skip
    gathered = common.all_gather(mine)
    if env.rank == 0:
        n = sum(p.numel() for p in params)
        common.write_json(args.out, {
            "format": args.format, "ranks": env.world_size, "num_params": n,
            "model_bytes": n * params[0].element_size(), "per_rank": gathered, "device": str(env.device),
        })  # fmt: skip
    del actor, params
    dist.barrier()  # every rank done with the group before teardown (a rank leaving early aborted the other)
    end_process()


def markdown(rec: dict[str, Any]) -> str:
    mb = {"model_mb": "model_bytes", "peak_mb": "peak_rank", "after_mb": "after_rank"}
    rows = [{**r, **{k: r[v] / 1e6 for k, v in mb.items()}} for r in rec["rows"]]
    skipped = "".join(f"Not run: {s}.\n" for s in rec.get("skipped", []))
    return common.blocks(
        "# Loading: peak host memory per rank",
        "The actor built by `model.load_format`: `sharded` (on the meta device, `fully_shard`, each rank reads only "
        "its rows of each tensor) or `full` (every rank loads the whole model, then shards it). `peak MB/rank`: the "
        "largest rank's high-water RSS growth during the load; `ratio` = peak / model bytes, ideal 1 / ranks.",
        common.table(rows, COLUMNS),
        skipped,
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    fig, ax = common.subplots(figsize=(7, 4.5))
    first, xs = rec["rows"][0], sorted({r["ranks"] for r in rec["rows"]})
    model_mb = first["model_bytes"] / 1e6
    curves: list[common.Curve] = []
    for i, fmt in enumerate(("sharded", "full")):
        rows = sorted((r for r in rec["rows"] if r["format"] == fmt), key=lambda r: r["ranks"])
        if rows:
            curves.append((fmt, [r["ranks"] for r in rows], [r["peak_rank"] / 1e6 for r in rows], f"C{i}o-"))
    curves.append(("model / ranks", xs, [model_mb / k for k in xs], "k--"))
    title = f"{first['model']} ({first['num_params'] / 1e6:.0f}M params, {model_mb:.0f} MB)"
    common.lines(ax, curves, title, xs, xlabel="ranks", ylabel="peak host MB per rank")
    common.save_figure(fig, path)


if __name__ == "__main__":
    common.standalone()
