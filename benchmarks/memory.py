"""Memory benchmark: FSDP2 parameter, gradient and AdamW state bytes per rank over 1, 2 and 4 ranks.

One GRPO step of the trainer (`torchrl_post.train`) per model and rank count, read back from its metrics.jsonl:
`perf/param_bytes`, `perf/grad_bytes` and `perf/optimizer_bytes` (the largest rank's local shards: parameters,
the gradients a step holds, AdamW's state after the step) and `perf/params`. `ratio` = the largest rank's bytes /
the 1-rank run's (the unsharded total); the ideal is 1 / ranks (AdamW's `step` scalars are kept whole on every
rank, so its state sits a few bytes above). These are tensor counts, deterministic, so the shared CPUs do not
matter here; 4 ranks on 2 cores is fine for memory. On a CUDA machine the rank counts stop at the number of GPUs.

    default   qwen2-10m, qwen2-40m and qwen2-100m on 1, 2, 4 ranks
    --quick   qwen2-10m on 1, 2, 4 ranks
    --tiny    qwen2-1m on 1, 2 ranks
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import SIZES, model_dir

NAME = "memory"
KINDS = ("params", "grads", "optimizer")
METRICS = {"params": "perf/param_bytes", "grads": "perf/grad_bytes", "optimizer": "perf/optimizer_bytes"}
SETTINGS = {
    "full": (("qwen2-10m", "qwen2-40m", "qwen2-100m"), (1, 2, 4)),
    "quick": (("qwen2-10m",), (1, 2, 4)),
    "tiny": (("qwen2-1m",), (1, 2)),
}


def rank_counts(wanted: tuple[int, ...]) -> list[int]:
    """The rank counts to run: on a CUDA machine one GPU per rank, so at most the GPU count."""
    import torch

    if torch.cuda.is_available():
        return [k for k in wanted if k <= torch.cuda.device_count()]
    return list(wanted)


def prompts() -> Path:
    """Eight sums in the project's data format (what the step trains on does not change what it holds)."""
    path = common.LOGS / "memory_data" / "train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1), "data_source": "arithmetic"} for i in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def step_bytes(model: str, ranks: int) -> dict[str, Any]:
    """One training step on `ranks` ranks: the largest rank's bytes per kind, from the step's metrics."""
    overrides = [
        f"model.path={model_dir(SIZES[model])}", f"data.train_files={prompts()}", "data.val_files=null",
        "data.train_batch_size=4", "rollout.n=2",
        "data.max_response_length=8", "trainer.total_training_steps=1", "trainer.test_freq=0",
        "trainer.val_before_train=false", "trainer.plots=false",
    ]  # fmt: skip
    rows, _ = common.train_run(f"memory_{model}_r{ranks}", overrides, nproc=ranks)
    step = rows[-1]
    return {"model": model, "ranks": ranks, "num_params": int(step["perf/params"])} | {
        f"{kind}_rank": int(step[metric]) for kind, metric in METRICS.items()
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode(args)
    models, wanted = SETTINGS[mode]
    rows = []
    for model in models:
        full: dict[str, int] = {}
        for ranks in sorted(rank_counts(wanted)):
            row = step_bytes(model, ranks)
            row["total_rank"] = sum(row[f"{k}_rank"] for k in KINDS)
            full = full or {k: row[f"{k}_rank"] for k in (*KINDS, "total")}  # the 1-rank run: unsharded
            row |= {f"{k}_full": full[k] for k in full} | {f"{k}_ratio": row[f"{k}_rank"] / full[k] for k in full}
            row["ideal_ratio"] = 1 / ranks
            rows.append(row)
            print(f"  {model} on {ranks} rank(s): ratio {row['total_ratio']:.4f} (ideal {1 / ranks:.4f})", flush=True)
    return {"mode": mode, "device": common.device_kind(), "rows": rows, "loadavg_1m": common.load_1m()}


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
    padding = (r["total_storage"] - r["total_rank"]) / 1e6 if "total_storage" in r else None  # records before 2026-12
    return {**r, **mb, "full_mb": r["total_full"] / 1e6, "padding_mb": padding}


def how(rec: dict[str, Any]) -> str:
    """How the record counted: the trainer's metrics, or (records before 2026-11-28) memory_worker.py's model."""
    if "total_storage" in rec["rows"][0]:
        return "in the model wrapped by the project's `apply_fsdp` and `build_optimizer` (`DTensor.to_local()`)"
    return "after one GRPO step of the trainer (`perf/param_bytes`, `perf/grad_bytes`, `perf/optimizer_bytes`)"


def markdown(rec: dict[str, Any]) -> str:
    rows = rec["rows"]
    worst = max(rows, key=lambda r: r["total_rank"] - r["total_full"] / r["ranks"])
    excess = worst["total_rank"] - worst["total_full"] / worst["ranks"]
    return "\n".join(
        [
            "# FSDP2 memory per rank",
            "",
            f"Parameters, gradients and AdamW state (after one step) held by each rank: the bytes of its local "
            f"shards, {how(rec)}, on {rec['device']}. `MB/rank`: the largest rank; `ratio` = that / the unsharded "
            "total (ideal 1 / ranks); `padding`: storage beyond the shards (FSDP2 pads dim 0 to a multiple of the "
            "ranks; older records). Activations and the parameters gathered during forward/backward come on top.",
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


if __name__ == "__main__":
    common.standalone(sys.modules[__name__])
