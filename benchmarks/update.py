"""Update benchmark: tokens/s of the actor's update (`Actor.update`, FSDP2) against a bare PyTorch loop (the plain
HF model and torch.optim.AdamW) over the same micro-batches, per micro-batching mode (benchmarks/update_worker.py).

A seeded GRPO-shaped batch (groups of 8 sharing a 40-120 token prompt, responses of 1-64 tokens); modes fixed,
dynamic, packed, packed_dynamic; each mode's shapes and runs: SETTINGS. Headline: `ratio` = ours / bare real
tokens/s (target >= 0.9). On CPU each rank runs `--threads` torch threads (default 1).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import SIZES, TINY, ModelSize, model_dir

NAME = "update"
WORKER = Path(__file__).resolve().parent / "update_worker.py"


@dataclass(frozen=True)
class Setting:
    """One mode of the benchmark: the model, the batch and micro-batch shapes, and the runs (ranks, lengths)."""

    model: ModelSize
    samples: int
    group: int
    micro: int
    budget: int
    repeats: int
    runs: tuple[tuple[int, str], ...]


SETTINGS = {
    "full": Setting(SIZES["qwen2-10m"], 64, 8, 8, 1536, 3, ((1, "uniform"), (2, "uniform"), (1, "skewed"))),
    "quick": Setting(SIZES["qwen2-10m"], 16, 8, 4, 768, 2, ((1, "uniform"),)),
    "tiny": Setting(TINY, 8, 4, 4, 512, 1, ((1, "uniform"),)),
}
PROMPT_LEN, RESPONSE_LEN = "40,120", "1,64"


OPTIONS: common.Options = {
    "--repeats": {"type": int},
    "--threads": {"type": int, "default": 1, "help": "CPU: torch threads per rank"},
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    args = common.options(args, OPTIONS)
    mode = common.mode(args)
    s = SETTINGS[mode]
    repeats = args.repeats or s.repeats
    runs = []
    for ranks, lengths in s.runs:
        print(f"  {s.model.name}, {ranks} rank(s), {lengths} lengths, {repeats} repeats ...", flush=True)
        worker_args = {
            "model": model_dir(s.model), "samples": s.samples, "group": s.group, "prompt_len": PROMPT_LEN,
            "response_len": RESPONSE_LEN, "lengths": lengths, "micro": s.micro, "budget": s.budget, "repeats": repeats,
        }  # fmt: skip
        env = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(args.threads)}
        runs.append(common.run_worker(f"update_{s.model.name}_{ranks}r_{lengths}", WORKER, ranks, worker_args, env))
    return {"mode": mode, "repeats": repeats, "threads": args.threads, "runs": runs, "loadavg_1m": common.load_1m()}


COLUMNS = [
    ("mode", "mode", "{}"), ("ours tok/s", "ours_tokens_per_s", "{:.0f}"), ("bare tok/s", "bare_tokens_per_s", "{:.0f}"),
    ("ratio", "ratio", "{:.2f}"), ("ratio (CPU s)", "ratio_cpu", "{:.2f}"),
    ("bare packed tok/s", "bare_packed_tokens_per_s", "{:.0f}"), ("ours / bare packed", "ratio_vs_bare_packed", "{:.2f}"),
    ("padding frac", "padding_frac", "{:.2f}"), ("bare padding frac", "bare_padding_frac", "{:.2f}"),
    ("micro-batches", "micro_batches", "{}"), ("ours s", "ours_s", "{:.2f}"), ("bare s", "bare_s", "{:.2f}"),
    ("bare packed s", "bare_packed_s", "{:.2f}"),
]  # fmt: skip


def conclusion(run: dict[str, Any]) -> str:
    rows = {r["mode"]: r for r in run["rows"]}
    ratios = [r["ratio"] for r in rows.values()]
    low = [m for m, r in rows.items() if r["ratio"] < 0.9]
    text = f"Ours / bare: {min(ratios):.2f}x to {max(ratios):.2f}x" + (
        f" (below the 0.9 target: {', '.join(low)})." if low else " (every mode at or above the 0.9 target)."
    )
    if cpu := [r["ratio_cpu"] for r in rows.values() if r.get("ratio_cpu")]:
        text += f" By CPU seconds: {min(cpu):.2f}x to {max(cpu):.2f}x."
    for m, r in rows.items():
        if r.get("bare_packed_tokens_per_s"):
            text += (
                f" {m}: packing removes {r['bare_padding_frac']:.0%} padding, the bare packed loop runs at "
                f"{r['bare_packed_tokens_per_s'] / r['bare_tokens_per_s']:.2f}x the bare padded one."
            )
    return text


def markdown(rec: dict[str, Any]) -> str:
    m = rec["machine"]
    parts = [
        "# Update benchmark: the actor's update against a bare PyTorch loop",
        f"{m['cpu_count']} CPUs, torch {m['torch']}; {rec.get('threads', 1)} torch thread(s) per rank; 1-minute "
        f"load average {rec['loadavg_1m']:.1f} at the end. Ours: `Actor.update` (FSDP2, PPO clip loss, clipping, "
        "AdamW); bare: the HF model and torch.optim.AdamW over the same micro-batches (padded, or packed), the "
        "on-policy PPO surrogate, clipping, a gradient all_reduce on 2 ranks. tokens/s: real tokens of the batch / "
        f"seconds of one update, median of {rec['repeats']} repeats taking turns. `ratio` = ours / bare padded "
        "tok/s; `ratio (CPU s)`: from rank 0's process CPU seconds; `padding frac`: ours.",
    ]
    for r in rec["runs"]:
        parts += [
            f"## {r['model']} ({r['params'] / 1e6:.1f}M parameters, {r['dtype']}, {r['device']}), {r['ranks']} "
            f"rank(s), {r['samples']} samples, {r['lengths']} response lengths",
            f"Prompts {r['prompt_len'].replace(',', '-')} tokens in groups of {r['group']}, responses "
            f"{r['response_len'].replace(',', '-')} tokens; {r['real_tokens']:.0f} real tokens in {r['cells']} "
            f"cells; micro-batches of {r['micro']} rows (fixed) or {r['budget']} tokens (dynamic).",
            common.table(r["rows"], COLUMNS),
            conclusion(r) + f" Load average {r['loadavg_1m']:.1f} after this run.",
        ]
    return common.blocks(*parts)


def plot(path: Path, rec: dict[str, Any]) -> None:
    runs = rec["runs"]
    fig, axes = common.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.5), squeeze=False)
    for ax, r in zip(axes[0], runs, strict=True):
        series = [
            (label, [row.get(f"{key}_tokens_per_s") or 0.0 for row in r["rows"]])
            for key, label in (("ours", "ours"), ("bare", "bare padded"), ("bare_packed", "bare packed"))
        ]
        common.bars(ax, [row["mode"] for row in r["rows"]], series, ylabel="real tokens / s (whole batch)")
        for bar, row in zip(ax.containers[0], r["rows"], strict=True):  # ours / bare over ours' bars
            ax.annotate(f"{row['ratio']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=8)  # fmt: skip
        ax.set_title(f"{r['model']}, {r['ranks']} rank(s), {r['samples']} samples, {r['lengths']}", fontsize=9)
    common.save_figure(fig, path, "update: Actor.update (ours, ratio ours/bare padded above) vs a bare PyTorch loop")


if __name__ == "__main__":
    common.standalone(sys.modules[__name__])
