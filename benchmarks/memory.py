"""Memory benchmark: FSDP2 parameter, gradient and AdamW state bytes per rank over 1, 2 and 4 ranks.

    python -m benchmarks --only memory [--quick | --tiny]     (or: python -m benchmarks.memory)

Runs benchmarks/memory_worker.py under torchrun for each model and rank count: the model wrapped with the
project's own `apply_fsdp` and `build_optimizer`, one forward/backward and one optimizer step, then every rank's
local shards counted (`DTensor.to_local()`). `ratio` = the largest rank's bytes / the unsharded total; the ideal
is 1 / ranks (AdamW's `step` scalars are kept whole on every rank, so its state sits a few bytes above). These are
tensor counts, deterministic, so the shared CPUs do not matter here; 4 ranks on 2 cores is fine for memory.
On a CUDA machine the rank counts stop at the number of GPUs.

    default   qwen2-10m, qwen2-40m and qwen2-100m on 1, 2, 4 ranks
    --quick   qwen2-10m on 1, 2, 4 ranks
    --tiny    qwen2-1m on 1, 2 ranks
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import SIZES, model_dir

NAME = "memory"
WORKER = Path(__file__).resolve().parent / "memory_worker.py"
KINDS = ("params", "grads", "optimizer")
SETTINGS = {
    "full": (("qwen2-10m", "qwen2-40m", "qwen2-100m"), (1, 2, 4)),
    "quick": (("qwen2-10m",), (1, 2, 4)),
    "tiny": (("qwen2-1m",), (1, 2)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one 10M model")
    ap.add_argument("--tiny", action="store_true", help="a 1M model on 1 and 2 ranks (tests)")
    ap.add_argument("--results", type=Path, default=common.RESULTS)
    return ap.parse_args(argv)


def rank_counts(wanted: tuple[int, ...]) -> list[int]:
    """The rank counts to run: on a CUDA machine one GPU per rank, so at most the GPU count."""
    import torch

    if torch.cuda.is_available():
        return [k for k in wanted if k <= torch.cuda.device_count()]
    return list(wanted)


def launch(model: str, ranks: int) -> dict[str, Any]:
    args = ["--model", str(model_dir(SIZES[model]))]
    rec: dict[str, Any] = common.run_worker(f"memory_{model}_r{ranks}", WORKER, ranks, args)
    return rec


def summarize(rec: dict[str, Any]) -> dict[str, Any]:
    """One row: per kind, the largest rank's shard and storage bytes, the unsharded bytes and their ratio."""
    row: dict[str, Any] = {"model": rec["model"], "ranks": rec["ranks"], "num_params": rec["num_params"]}
    per_rank = rec["per_rank"]
    for kind in (*KINDS, "total"):
        kinds = KINDS if kind == "total" else (kind,)
        shard = max(sum(r[k]["shard"] for k in kinds) for r in per_rank)
        storage = max(sum(r[k]["storage"] for k in kinds) for r in per_rank)
        full = sum(per_rank[0][k]["full"] for k in kinds)
        row |= {f"{kind}_rank": shard, f"{kind}_storage": storage, f"{kind}_full": full, f"{kind}_ratio": shard / full}
    row["ideal_ratio"] = 1 / rec["ranks"]
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    args = common.options(args, parse_args)
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    models, wanted = SETTINGS[mode]
    rows, raw = [], []
    for model in models:
        for ranks in rank_counts(wanted):
            t0 = time.perf_counter()
            rec = launch(model, ranks)
            raw.append(rec)
            row = summarize(rec)
            rows.append(row)
            print(
                f"  {model} on {ranks} rank(s): {row['total_rank'] / 1e6:.2f} MB per rank of "
                f"{row['total_full'] / 1e6:.2f} MB, ratio {row['total_ratio']:.4f} (ideal {1 / ranks:.4f}) "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    return {"mode": mode, "device": raw[0]["device"], "rows": rows, "runs": raw, "loadavg_1m": common.load_1m()}


# ---- reports -----------------------------------------------------------------------------------------------

COLUMNS = [
    ("model", "model", "{}"),
    ("ranks", "ranks", "{}"),
    ("params MB/rank", "params_mb", "{:.2f}"),
    ("grads MB/rank", "grads_mb", "{:.2f}"),
    ("AdamW MB/rank", "optimizer_mb", "{:.2f}"),
    ("total MB/rank", "total_mb", "{:.2f}"),
    ("unsharded MB", "full_mb", "{:.2f}"),
    ("ratio", "total_ratio", "{:.4f}"),
    ("ideal", "ideal_ratio", "{:.4f}"),
    ("params ratio", "params_ratio", "{:.4f}"),
    ("AdamW ratio", "optimizer_ratio", "{:.4f}"),
    ("padding MB/rank", "padding_mb", "{:.3f}"),
]


def _table_row(r: dict[str, Any]) -> dict[str, Any]:
    mb = {f"{k}_mb": r[f"{k}_rank"] / 1e6 for k in (*KINDS, "total")}
    return {**r, **mb, "full_mb": r["total_full"] / 1e6, "padding_mb": (r["total_storage"] - r["total_rank"]) / 1e6}


def markdown(rec: dict[str, Any]) -> str:
    rows = rec["rows"]
    worst = max(rows, key=lambda r: r["total_rank"] - r["total_full"] / r["ranks"])
    excess = worst["total_rank"] - worst["total_full"] / worst["ranks"]
    return "\n".join(
        [
            "# FSDP2 memory per rank",
            "",
            f"Parameters, gradients (after one backward) and AdamW state (after one step) held by each rank: the "
            f"bytes of its local shards (`DTensor.to_local()`), the model wrapped by the project's `apply_fsdp` "
            f"(per decoder layer, then the root) and `build_optimizer`, on {rec['device']}. `MB/rank`: the largest "
            "rank; `ratio` = that / the unsharded total (ideal 1 / ranks); `padding`: storage beyond the shards "
            "(FSDP2 pads dim 0 to a multiple of the ranks). Activations and the parameters gathered during "
            "forward/backward come on top of these.",
            "",
            common.table([_table_row(r) for r in rows], COLUMNS),
            f"Every rank holds at most {excess:,.0f} bytes above the ideal total / ranks (worst: {worst['model']} on "
            f"{worst['ranks']} ranks, ratio {worst['total_ratio']:.5f}): AdamW's `step` scalars (one per parameter "
            "tensor, kept whole on every rank) and any dim 0 that does not split evenly over the ranks.",
            "",
        ]
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    plt = common.pyplot()

    models = list(dict.fromkeys(r["model"] for r in rec["rows"]))
    fig, axes = plt.subplots(1, len(models), figsize=(max(7.0, 5.5 * len(models)), 4.5), squeeze=False)
    labels = {"params": "parameters", "grads": "gradients", "optimizer": "AdamW state", "total": "total"}
    for ax, model in zip(axes[0], models, strict=True):
        rows = sorted((r for r in rec["rows"] if r["model"] == model), key=lambda r: r["ranks"])
        xs = [r["ranks"] for r in rows]
        for i, kind in enumerate((*KINDS, "total")):
            style = "x--" if kind == "grads" else "o-"  # gradients are as large as the parameters: drawn over them
            ax.plot(xs, [r[f"{kind}_rank"] / 1e6 for r in rows], style, color=f"C{i}", label=labels[kind])
        ax.plot(xs, [rows[0]["total_full"] / 1e6 / k for k in xs], "k--", alpha=0.6, label="ideal total (1/ranks)")
        ax.set(xscale="log", yscale="log", xlabel="ranks", ylabel="MB per rank (largest rank)")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_title(f"{model} ({rows[0]['num_params'] / 1e6:.1f}M params)")
        ax.legend(fontsize=8)
    fig.suptitle("FSDP2 per-rank memory: local shards after one backward and one AdamW step", fontsize=10)
    common.save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    common.standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
