"""Weight-sync benchmark: how close the trainer -> vLLM weight sync gets to the raw collective.

Builds (and caches under outputs/bench_models) random Qwen2 models of about 1M, 10M, 40M and 100M parameters,
then runs benchmarks/sync_worker.py under torchrun for each:
  colocated, 2 actor ranks   sync_weights (bucketed all_gather + vLLM reload) vs the same all_gathers, bare
  broadcast, 1 actor + 1     BroadcastSync send/receive vs one broadcast of the bytes
and, for the largest model, broadcast with 1 actor and 1, 2, 3 rollout ranks (scaling with receivers) and
with 2 actor ranks (an FSDP gather before the broadcast).
`ratio` = raw_s / sync_s (1.0: the sync moves weights as fast as the bare collective; the target is 0.7), and
`transfer ratio` = raw_s / transfer_s for the sync path without the engine's reload.
`--quick`: the smallest model, colocated and 1 + 1 broadcast only; `--tiny`: the same with one repeat.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import SIZES, ModelSize, model_dir

NAME = "sync"
WORKER = Path(__file__).resolve().parent / "sync_worker.py"
TARGET_RATIO = 0.7
SCALING_ROLLOUTS = (1, 2, 3)
MODELS = ("qwen2-1m", "qwen2-10m", "qwen2-40m", "qwen2-100m")


@dataclass(frozen=True)
class Run:
    model: ModelSize
    mode: str
    actor: int
    rollout: int

    @property
    def nproc(self) -> int:
        return self.actor if self.mode == "colocated" else self.actor + self.rollout

    @property
    def tag(self) -> str:
        return f"{self.model.name}_{self.mode}_a{self.actor}_r{self.rollout}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = common.parser(__doc__)
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3, --tiny 1)")
    ap.add_argument("--bucket-mb", type=int, default=64)
    return ap.parse_args(argv)


def plan_runs(args: argparse.Namespace) -> list[Run]:
    if args.quick or args.tiny:
        small = SIZES[MODELS[0]]
        return [Run(small, "colocated", 2, 0), Run(small, "broadcast", 1, 1)]
    sizes = [SIZES[m] for m in MODELS]
    runs = [Run(s, "colocated", 2, 0) for s in sizes]
    runs += [Run(s, "broadcast", 1, 1) for s in sizes]
    runs += [Run(sizes[-1], "broadcast", 1, m) for m in SCALING_ROLLOUTS if m != 1]
    runs.append(Run(sizes[-1], "broadcast", 2, 1))  # with an FSDP gather over two actor ranks first
    return runs


def launch(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """One torchrun of the worker; its output goes to a log, its record comes back."""
    worker_args = [
        *("--model", str(model_dir(run.model)), "--mode", run.mode),
        *("--actor", str(run.actor), "--rollout", str(run.rollout)),
        *("--bucket-mb", str(args.bucket_mb), "--repeats", str(args.repeats)),
    ]
    rec: dict[str, Any] = common.run_worker(f"sync_{run.tag}", WORKER, run.nproc, worker_args)
    rec["transfer_ratio"] = rec["raw_s"] / rec["transfer_s"]
    return rec


def summary(rec: dict[str, Any]) -> str:
    return (
        f"sync {rec['sync_s'] * 1e3:8.1f} ms ({rec['sync_GBps']:.3f} GB/s)  "
        f"raw {rec['raw_s'] * 1e3:8.1f} ms ({rec['raw_GBps']:.3f} GB/s)  ratio {rec['ratio']:.2f}"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    args = common.options(args, parse_args)
    args.repeats = args.repeats or (1 if args.tiny else 3)
    runs = plan_runs(args)
    records: list[dict[str, Any]] = []
    for i, r in enumerate(runs, 1):
        t0 = time.perf_counter()
        print(f"  [{i}/{len(runs)}] {r.tag} on {r.nproc} ranks ...", flush=True)
        common.warn_if_busy()
        rec = launch(r, args)
        records.append(rec)
        print(f"      {summary(rec)}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return {
        "quick": args.quick,
        "tiny": args.tiny,
        "repeats": args.repeats,
        "bucket_mb": args.bucket_mb,
        "target_ratio": TARGET_RATIO,
        "records": records,
        "loadavg_1m": common.load_1m(),
    }


# ---- reports -----------------------------------------------------------------------------------------------

COLUMNS = [
    ("mode", "mode", "{}"),
    ("actor", "actor", "{}"),
    ("rollout", "rollout", "{}"),
    ("model", "model", "{}"),
    ("params", "params", "{:,}"),
    ("MB", "MB", "{:.1f}"),
    ("sync ms", "sync_ms", "{:.1f}"),
    ("raw ms", "raw_ms", "{:.1f}"),
    ("transfer ms", "transfer_ms", "{:.1f}"),
    ("load ms", "load_ms", "{:.1f}"),
    ("sync GB/s", "sync_GBps", "{:.3f}"),
    ("raw GB/s", "raw_GBps", "{:.3f}"),
    ("ratio", "ratio", "{:.2f}"),
    ("transfer ratio", "transfer_ratio", "{:.2f}"),
    ("loadavg", "loadavg_1m", "{:.1f}"),
]


def _row(r: dict[str, Any]) -> dict[str, Any]:
    ms = {f"{k}_ms": r[f"{k}_s"] * 1e3 for k in ("sync", "raw", "transfer", "load")}
    return {**r, **ms, "MB": r["bytes"] / 1e6}


def markdown(rec: dict[str, Any]) -> str:
    m = rec["machine"]
    return "\n".join(
        [
            "# Weight-sync benchmark",
            "",
            f"{m['cpu_count']} CPUs, torch {m['torch']}, vllm {m['vllm']}. Median of {rec['repeats']} repeats; "
            "`transfer` is the sync path without the engine load, `load ms` the engine's reload alone; `loadavg` is the "
            "1-minute load average at the end of the run (above the run's own ranks: the CPUs were shared).",
            "",
            common.table([_row(r) for r in rec["records"]], COLUMNS),
            f"Target: ratio = raw_s / sync_s of at least {rec['target_ratio']}. `ratio` is end to end (until the engine "
            "holds the weights, vLLM's reload included); `transfer ratio` = raw_s / transfer_s is the sync path up to "
            "the engine's loader.",
            "",
            "raw is the bare collective for the same bytes, in buffers allocated once: the same bucketed all_gathers "
            "(colocated), one broadcast of all the bytes over the sync group (disaggregated; with 2 actor ranks the "
            "sync also gathers the FSDP shards first, which the raw broadcast does not). On 2 CPU cores every "
            "process competes for the same cores, so the engine's reload (CPU repacking in vLLM) cannot overlap "
            "the broadcast of the next bucket the way it does on a GPU, and with 3-4 processes the cores are "
            "oversubscribed.",
            "",
        ]
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    plt = common.pyplot()

    records = rec["records"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {"colocated": ("C0", "colocated (2 actor ranks)"), "broadcast": ("C1", "broadcast (1 actor -> 1 rollout)")}
    for mode, (color, label) in series.items():
        rs = sorted(
            (r for r in records if r["mode"] == mode and (mode == "colocated" or r["rollout"] == r["actor"] == 1)),
            key=_mb,
        )
        xs = [_mb(r) for r in rs]
        left.plot(xs, [r["sync_GBps"] for r in rs], "o-", color=color, label=f"{label}: sync")
        left.plot(xs, [r["raw_GBps"] for r in rs], "s--", color=color, alpha=0.6, label=f"{label}: raw")
    left.set(xscale="log", yscale="log", xlabel="model size (MB, float32)", ylabel="GB/s")
    left.set_title("sync vs raw collective bandwidth")
    left.legend(fontsize=8)
    scaling_plot(right, records)
    common.save_figure(fig, path)


def _mb(r: dict[str, Any]) -> float:
    return float(r["bytes"]) / 1e6


def scaling_plot(ax: Any, records: list[dict[str, Any]]) -> None:
    bcast = [r for r in records if r["mode"] == "broadcast"]
    if not bcast:
        return
    biggest = max(r["bytes"] for r in bcast)
    rs = sorted((r for r in bcast if r["bytes"] == biggest and r["actor"] == 1), key=lambda r: r["rollout"])
    xs = [r["rollout"] for r in rs]
    ax.plot(xs, [r["sync_s"] for r in rs], "o-", label="sync")
    ax.plot(xs, [r["transfer_s"] for r in rs], "^-", label="transfer (no engine load)")
    ax.plot(xs, [r["raw_s"] for r in rs], "s--", label="raw broadcast")
    ax.set(xlabel="rollout ranks", ylabel="seconds", xticks=xs)
    ax.set_title(f"broadcast sync time, {rs[0]['model']} ({_mb(rs[0]):.0f} MB)")
    ax.legend(fontsize=8)


if __name__ == "__main__":
    common.standalone(sys.modules[__name__])
