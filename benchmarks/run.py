"""Weight-sync benchmark driver: how close the trainer -> vLLM weight sync gets to the raw collective.

    python -m benchmarks.run [--quick] [--repeats R] [--bucket-mb B]

Builds (and caches under outputs/bench_models) tiny random Qwen2 models of about 1M, 10M, 40M and 100M
parameters, then runs benchmarks/sync_worker.py under torchrun for each:
  colocated, 2 actor ranks   sync_weights (bucketed all_gather + vLLM reload) vs the same all_gathers, bare
  broadcast, 1 actor + 1     BroadcastSync send/receive vs one broadcast of the bytes
and, for the largest model, broadcast with 1 actor and 1, 2, 3 rollout ranks (scaling with receivers) and
with 2 actor ranks (an FSDP gather before the broadcast).
`ratio` = raw_s / sync_s (1.0: the sync moves weights as fast as the bare collective; the target is 0.7), and
`transfer ratio` = raw_s / transfer_s for the sync path without the engine's reload.
Writes benchmarks/results/sync.json, sync.png and sync.md. `--quick` runs the smallest model only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "sync_worker.py"
RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ROOT / "outputs" / "bench_models"
LOGS = ROOT / "outputs" / "bench_logs"
TARGET_RATIO = 0.7
SCALING_ROLLOUTS = (1, 2, 3)


@dataclass(frozen=True)
class ModelSize:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


# head_dim = hidden_size / num_heads is 32 or 64 (build_tiny_model's constraint); vocab is 128 throughout.
SIZES = (
    ModelSize("qwen2-1m", 128, 5, 4, 2, 384),
    ModelSize("qwen2-10m", 256, 10, 4, 2, 1024),
    ModelSize("qwen2-40m", 512, 13, 8, 4, 1536),
    ModelSize("qwen2-100m", 768, 13, 12, 4, 2560),
)


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the smallest model only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--report-only", action="store_true", help="rebuild sync.md and sync.png from sync.json")
    return ap.parse_args(argv)


def model_dir(size: ModelSize) -> Path:
    """The model's directory, built once (build_tiny_model is seeded, so a cached one is the same model)."""
    out = MODELS / size.name
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    from torchrl_post.demo.build import build_tiny_model

    spec = {k: v for k, v in asdict(size).items() if k != "name"}
    build_tiny_model(out, seed=0, **spec)
    return out


def plan_runs(sizes: tuple[ModelSize, ...]) -> list[Run]:
    runs = [Run(s, "colocated", 2, 0) for s in sizes]
    runs += [Run(s, "broadcast", 1, 1) for s in sizes]
    runs += [Run(sizes[-1], "broadcast", 1, m) for m in SCALING_ROLLOUTS if m != 1]
    runs.append(Run(sizes[-1], "broadcast", 2, 1))  # with an FSDP gather over two actor ranks first
    return runs


def torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def launch(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """One torchrun of the worker; its output goes to a log, its record comes back."""
    out = LOGS / f"{run.tag}.json"
    log = LOGS / f"{run.tag}.log"
    out.unlink(missing_ok=True)
    cmd = [
        *torchrun(),
        "--standalone",
        "--nproc-per-node",
        str(run.nproc),
        str(WORKER),
        *("--model", str(model_dir(run.model)), "--mode", run.mode),
        *("--actor", str(run.actor), "--rollout", str(run.rollout)),
        *("--bucket-mb", str(args.bucket_mb), "--repeats", str(args.repeats), "--out", str(out)),
    ]
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"{run.tag} failed (exit {proc.returncode}); log {log}:\n{tail}")
    rec: dict[str, Any] = json.loads(out.read_text())
    rec["loadavg_1m"] = os.getloadavg()[0]  # at the end: above `world`, something else shared the CPUs
    return rec


def write_report(
    results: Path, name: str, rec: dict[str, Any], markdown: Callable[[dict[str, Any]], str], plot: Callable[..., None]
) -> None:
    """<results>/<name>.json (the record), .md (`markdown(rec)`) and .png (`plot(path, rec)`)."""
    (results / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    (results / f"{name}.md").write_text(markdown(rec))
    plot(results / f"{name}.png", rec)


def warn_if_busy() -> None:
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > cpus:
        print(f"    warning: load average {load:.1f} on {cpus} CPUs; other processes share the timings", flush=True)


def machine() -> dict[str, Any]:
    import vllm

    return {
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "vllm": vllm.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def summary(rec: dict[str, Any]) -> str:
    return (
        f"sync {rec['sync_s'] * 1e3:8.1f} ms ({rec['sync_GBps']:.3f} GB/s)  "
        f"raw {rec['raw_s'] * 1e3:8.1f} ms ({rec['raw_GBps']:.3f} GB/s)  ratio {rec['ratio']:.2f}"
    )


# ---- reports -----------------------------------------------------------------------------------------------


def write_json(path: Path, records: list[dict[str, Any]], args: argparse.Namespace) -> None:
    meta = {"machine": machine(), "repeats": args.repeats, "bucket_mb": args.bucket_mb, "target_ratio": TARGET_RATIO}
    path.write_text(json.dumps({**meta, "records": records}, indent=1) + "\n")


COLUMNS = (
    ("mode", "mode", "{}"),
    ("actor", "actor", "{}"),
    ("rollout", "rollout", "{}"),
    ("model", "model", "{}"),
    ("params", "params", "{:,}"),
    ("MB", "bytes", "{:.1f}"),
    ("sync ms", "sync_s", "{:.1f}"),
    ("raw ms", "raw_s", "{:.1f}"),
    ("transfer ms", "transfer_s", "{:.1f}"),
    ("load ms", "load_s", "{:.1f}"),
    ("sync GB/s", "sync_GBps", "{:.3f}"),
    ("raw GB/s", "raw_GBps", "{:.3f}"),
    ("ratio", "ratio", "{:.2f}"),
    ("transfer ratio", "transfer_ratio", "{:.2f}"),
    ("loadavg", "loadavg_1m", "{:.1f}"),
)
SCALE = {"bytes": 1e-6, "sync_s": 1e3, "raw_s": 1e3, "transfer_s": 1e3, "load_s": 1e3}


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    head = "| " + " | ".join(c[0] for c in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    rows = [
        "| " + " | ".join(fmt.format(r[k] * SCALE[k] if k in SCALE else r[k]) for _, k, fmt in COLUMNS) + " |"
        for r in records
    ]
    return "\n".join(
        [
            "# Weight-sync benchmark",
            "",
            f"{meta['cpu_count']} CPUs, torch {meta['torch']}, vllm {meta['vllm']}, gloo. Median of the repeats; "
            "`transfer` is the sync path without the engine load, `load ms` the engine's reload alone; `loadavg` is the "
            "1-minute load average at the end of the run (above the run's own ranks: the CPUs were shared).",
            "",
            head,
            rule,
            *rows,
            "",
            f"Target: ratio = raw_s / sync_s of at least {TARGET_RATIO}. `ratio` is end to end (until the engine "
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


def report(args: argparse.Namespace, records: list[dict[str, Any]]) -> None:
    for r in records:
        r["transfer_ratio"] = r["raw_s"] / r["transfer_s"]
    write_json(args.results / "sync.json", records, args)
    (args.results / "sync.md").write_text(markdown(records, machine()))
    plot(args.results / "sync.png", records)


def plot(path: Path, records: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


# ---- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report_only:
        records = json.loads((args.results / "sync.json").read_text())["records"]
        report(args, records)
        return
    sizes = SIZES[:1] if args.quick else SIZES
    LOGS.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(sizes)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    for i, run in enumerate(runs, 1):
        t0 = time.perf_counter()
        print(f"[{i}/{len(runs)}] {run.tag} on {run.nproc} ranks ...", flush=True)
        warn_if_busy()
        rec = launch(run, args)
        records.append(rec)
        print(f"    {summary(rec)}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    report(args, records)
    print(f"done in {time.perf_counter() - start:.0f} s; results in {args.results}", flush=True)


if __name__ == "__main__":
    main()
