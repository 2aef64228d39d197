"""Weight-sync benchmark: how close the trainer -> vLLM weight sync gets to the raw collective of the same bytes.

benchmarks/sync_worker.py per random Qwen2 (MODELS): colocated on 2 actor ranks and broadcast from 1 actor to 1
rollout rank; for the largest also 2 and 3 rollout ranks and 2 actor ranks. `ratio` = raw_s / sync_s (target 0.7).
`--quick`: the smallest model, colocated and 1 + 1 broadcast; `--tiny`: the same, one repeat.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import SIZES, model_dir

NAME = "sync"
WORKER = Path(__file__).resolve().parent / "sync_worker.py"
TARGET_RATIO = 0.7
MODELS = ("qwen2-1m", "qwen2-10m", "qwen2-40m", "qwen2-100m")
BROADCAST_CURVES = (
    ("sync", "sync", "o-"),
    ("transfer", "transfer (no engine load)", "^-"),
    ("raw", "raw broadcast", "s--"),
)


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
    args = common.options(args, OPTIONS)
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
        rec = common.run_worker(f"sync_{tag}", WORKER, nproc, worker_args)
        rec["transfer_ratio"] = rec["raw_s"] / rec["transfer_s"]
        records.append(rec)
        print(f"      sync {rec['sync_s'] * 1e3:.1f} ms, raw {rec['raw_s'] * 1e3:.1f} ms, ratio {rec['ratio']:.2f}")
    return {
        "quick": args.quick, "tiny": args.tiny, "repeats": args.repeats, "bucket_mb": args.bucket_mb,
        "target_ratio": TARGET_RATIO, "records": records, "loadavg_1m": common.load_1m(),
    }  # fmt: skip


COLUMNS = [
    ("mode", "mode", "{}"), ("actor", "actor", "{}"), ("rollout", "rollout", "{}"), ("model", "model", "{}"),
    ("params", "params", "{:,}"), ("MB", "MB", "{:.1f}"), ("sync ms", "sync_ms", "{:.1f}"),
    ("raw ms", "raw_ms", "{:.1f}"), ("transfer ms", "transfer_ms", "{:.1f}"), ("load ms", "load_ms", "{:.1f}"),
    ("sync GB/s", "sync_GBps", "{:.3f}"), ("raw GB/s", "raw_GBps", "{:.3f}"), ("ratio", "ratio", "{:.2f}"),
    ("transfer ratio", "transfer_ratio", "{:.2f}"), ("loadavg", "loadavg_1m", "{:.1f}"),
]  # fmt: skip


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
        right.set(xlabel="rollout ranks", ylabel="seconds")
        common.lines(right, curves, f"broadcast sync time, {rs[0]['model']} ({biggest / 1e6:.0f} MB)", xs)
    common.save_figure(fig, path)


if __name__ == "__main__":
    common.standalone(sys.modules[__name__])
