"""Memory benchmark: FSDP2 parameter, gradient and AdamW bytes per rank over 1, 2 and 4 ranks (SETTINGS), from one
trainer step's `perf/param_bytes`, `perf/grad_bytes` and `perf/optimizer_bytes`; on CUDA up to the GPU count.
"""

from __future__ import annotations

import argparse
import json
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
COLUMNS = [
    ("model", "model", "{}"), ("ranks", "ranks", "{}"), ("params MB/rank", "params_mb", "{:.2f}"),
    ("grads MB/rank", "grads_mb", "{:.2f}"), ("AdamW MB/rank", "optimizer_mb", "{:.2f}"),
    ("total MB/rank", "total_mb", "{:.2f}"), ("unsharded MB", "full_mb", "{:.2f}"), ("ratio", "total_ratio", "{:.4f}"),
    ("ideal", "ideal_ratio", "{:.4f}"), ("params ratio", "params_ratio", "{:.4f}"),
    ("AdamW ratio", "optimizer_ratio", "{:.4f}"), ("padding MB/rank", "padding_mb", "{:.3f}"),
]  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    mode = common.mode(args)
    models, wanted = SETTINGS[mode]
    if torch.cuda.is_available():  # one GPU per rank
        wanted = tuple(k for k in wanted if k <= torch.cuda.device_count())
    # Eight sums in the project's data format (what the step trains on does not change what it holds).
    data = common.LOGS / "memory_data" / "train.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1),
                                        "data_source": "arithmetic"}) + "\n" for i in range(8)))  # fmt: skip
    rows, device = [], "cuda" if torch.cuda.is_available() else "cpu"  # what the trainer runs on
    for model in models:
        full: dict[str, int] = {}
        for ranks in sorted(wanted):
            overrides = [
                f"model.path={model_dir(SIZES[model])}", f"data.train_files={data}", "data.val_files=null",
                "data.train_batch_size=4", "rollout.n=2", "data.max_response_length=8",
                "trainer.total_training_steps=1", "trainer.test_freq=0", "trainer.val_before_train=false",
                "trainer.plots=false",
            ]  # fmt: skip
            step = common.train_run(f"memory_{model}_r{ranks}", overrides, nproc=ranks)[0][-1]
            row: dict[str, Any] = {"model": model, "ranks": ranks, "num_params": int(step["perf/params"])}
            row |= {f"{kind}_rank": int(step[metric]) for kind, metric in METRICS.items()}
            row["total_rank"] = sum(row[f"{k}_rank"] for k in KINDS)
            full = full or {k: row[f"{k}_rank"] for k in (*KINDS, "total")}  # the 1-rank run: unsharded
            row |= {f"{k}_full": full[k] for k in full} | {f"{k}_ratio": row[f"{k}_rank"] / full[k] for k in full}
            row["ideal_ratio"] = 1 / ranks
            rows.append(row)
            print(f"  {model} on {ranks} rank(s): ratio {row['total_ratio']:.4f} (ideal {1 / ranks:.4f})", flush=True)
    return {"mode": mode, "device": device, "rows": rows, "loadavg_1m": common.load_1m()}


def markdown(rec: dict[str, Any]) -> str:
    rows = rec["rows"]
    old = "total_storage" in rows[0]  # records before 2026-11-28: memory_worker.py's count, with FSDP's padding
    table = [
        {
            **r, **{f"{k}_mb": r[f"{k}_rank"] / 1e6 for k in (*KINDS, "total")}, "full_mb": r["total_full"] / 1e6,
            "padding_mb": (r["total_storage"] - r["total_rank"]) / 1e6 if old else None,
        }
        for r in rows
    ]  # fmt: skip
    how = (
        "in the model wrapped by the project's `apply_fsdp` and `build_optimizer` (`DTensor.to_local()`)"
        if old
        else "after one GRPO step of the trainer (`perf/param_bytes`, `perf/grad_bytes`, `perf/optimizer_bytes`)"
    )
    worst = max(rows, key=lambda r: r["total_rank"] - r["total_full"] / r["ranks"])
    excess = worst["total_rank"] - worst["total_full"] / worst["ranks"]
    return common.blocks(
        "# FSDP2 memory per rank",
        "Parameters, gradients and AdamW state (after one step) held by each rank: the bytes of its local shards, "
        f"{how}, on {rec['device']}. `MB/rank`: the largest rank; `ratio` = that / the unsharded total (ideal 1 / "
        "ranks); `padding`: storage beyond the shards (older records). Activations and gathered parameters add to it.",
        common.table(table, COLUMNS),
        f"Every rank holds at most {excess:,.0f} bytes above the ideal total / ranks (worst: {worst['model']} on "
        f"{worst['ranks']} ranks, ratio {worst['total_ratio']:.5f}): AdamW's `step` scalars (one per parameter "
        "tensor, whole on every rank) and any dim 0 that does not split evenly over the ranks.",
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    models = list(dict.fromkeys(r["model"] for r in rec["rows"]))
    fig, axes = common.subplots(1, len(models), figsize=(max(7.0, 5.5 * len(models)), 4.5), squeeze=False)
    labels = {"params": "parameters", "grads": "gradients", "optimizer": "AdamW state", "total": "total"}
    for ax, model in zip(axes[0], models, strict=True):
        rows = sorted((r for r in rec["rows"] if r["model"] == model), key=lambda r: r["ranks"])
        xs = [r["ranks"] for r in rows]
        # gradients are as large as the parameters: drawn dashed over them
        curves: list[common.Curve] = [
            (label, xs, [r[f"{kind}_rank"] / 1e6 for r in rows], f"C{i}x--" if kind == "grads" else f"C{i}o-")
            for i, (kind, label) in enumerate(labels.items())
        ]
        curves.append(("ideal total (1/ranks)", xs, [rows[0]["total_full"] / 1e6 / k for k in xs], "k--"))
        ax.set(xscale="log", yscale="log", xlabel="ranks", ylabel="MB per rank (largest rank)")
        common.lines(ax, curves, f"{model} ({rows[0]['num_params'] / 1e6:.1f}M params)", xs)
    common.save_figure(fig, path, "FSDP2 per-rank memory: local shards after one backward and one AdamW step")


if __name__ == "__main__":
    common.standalone()
