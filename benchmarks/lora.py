"""LoRA benchmark: LoRA against full fine-tuning on the same model, through the real training entrypoint.

For each model (the demo model, ~0.4M parameters, and a random Qwen2 of ~25M parameters built once under
outputs/bench_models with the demo's character tokenizer, so the demo data fits it) runs
`torchrun --standalone --nproc-per-node 2 -m torchrl_post.train` twice: full fine-tuning (configs/config.yaml)
and LoRA (`--config-name lora` at rank 16, alpha 32: all-linear, lr 2e-3; merged and adapter sync), validation and checkpoints off. From
each run's metrics.jsonl: the median over steps 3..N of `timing_s/step`, `timing_s/update_actor`,
`timing_s/sync` and `perf/sync_bytes` (the first two steps hold the warm-up).
Parameters and trainable parameters are the run's `perf/params` and `perf/trainable_params`; AdamW state is 2
float32 moments per trainable parameter, all ranks together (FSDP shards it over the ranks).
`--quick`: the demo model only, 6 steps; `--tiny`: the demo model, 3 steps, full fine-tuning and merged LoRA only.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import ROOT, demo_model

NAME = "lora"
MODES = ("full", "lora", "lora_adapter")
LABELS = {"full": "full fine-tuning", "lora": "LoRA r16", "lora_adapter": "LoRA r16, adapter sync"}
LORA_RANK, LORA_ALPHA = 16, 32
ADAM_BYTES_PER_PARAM = 2 * 4  # exp_avg and exp_avg_sq in float32
FIRST_STEP = 3  # medians over steps FIRST_STEP..N
METRICS = {
    "step_s": "timing_s/step",
    "update_s": "timing_s/update_actor",
    "sync_s": "timing_s/sync",
    "gen_s": "timing_s/gen",
    "sync_bytes": "perf/sync_bytes",  # the bytes gathered for the engine (LoRA: base + adapter tensors)
    "logprob_diff": "rollout/logprob_diff",
    "score_mean": "critic/score/mean",
}


@dataclass(frozen=True)
class BenchModel:
    name: str
    path: Path
    steps: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = common.parser(__doc__)
    ap.add_argument("--steps", type=int, default=None, help="training steps on the demo model (default 20)")
    ap.add_argument("--big-steps", type=int, default=None, help="training steps on the ~25M model (default 10)")
    return ap.parse_args(argv)


def big_model() -> Path:
    out = common.MODELS / "qwen2-25m-lora"
    if not (out / "config.json").is_file():
        from torchrl_post.demo.build import build_tiny_model

        print(f"building a ~25M-parameter Qwen2 under {out} (once) ...", flush=True)
        build_tiny_model(out, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536)
    return out


# ---- training runs --------------------------------------------------------------------------------------------


def train(model: BenchModel, mode: str) -> tuple[dict[str, Any], dict[str, int]]:
    """One run's medians (METRICS) and the model's parameters as the trainer wrapped it (`perf/params`,
    `perf/trainable_params`; AdamW's state is two float32 tensors per trainable parameter)."""
    overrides = [
        *(["--config-name", "lora", f"model.lora_rank={LORA_RANK}", f"model.lora_alpha={LORA_ALPHA}"] if mode != "full" else []),
        *(["rollout.lora_sync=adapter"] if mode == "lora_adapter" else []),
        f"model.path={model.path}", f"trainer.total_training_steps={model.steps}", "trainer.test_freq=0",
    ]  # fmt: skip
    print(f"{model.name} {LABELS[mode]}: {model.steps} steps ...", flush=True)
    rows, wall = common.train_run(f"lora_{model.name}_{mode}", overrides, nproc=2)
    kept = [r for r in rows if r.get("training/global_step", 0) >= FIRST_STEP] or rows
    rec: dict[str, Any] = {"steps": len(rows), "median_over_steps": f"{FIRST_STEP}..{len(rows)}", "run_wall_s": wall}
    rec |= {key: common.median(kept, metric) for key, metric in METRICS.items()}
    rec["loadavg_1m"] = common.load_1m()
    print(f"    step {rec['step_s']:.3f} s, sync {rec['sync_bytes'] / 1e6:.2f} MB, run {wall:.0f} s", flush=True)
    trainable = int(rows[-1]["perf/trainable_params"])
    params = {"total_params": int(rows[-1]["perf/params"]), "trainable_params": trainable}
    return rec, params | {"optimizer_state_bytes": trainable * ADAM_BYTES_PER_PARAM}


# ---- reports --------------------------------------------------------------------------------------------------


def modes_of(model: dict[str, Any]) -> list[str]:
    """The modes a model was run in (--tiny leaves out the adapter sync)."""
    return [m for m in MODES if m in model["runs"]]


def _mb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.2f}"


def markdown(rec: dict[str, Any]) -> str:
    m = rec["machine"]
    loads = [r["loadavg_1m"] for model in rec["models"] for r in model["runs"].values()]
    load = min(loads)
    lines = [
        "# LoRA benchmark",
        "",
        f"{m['cpu_count']} CPUs (shared with other jobs; 1-minute load average {load:.1f} to "
        f"{max(loads):.1f} during the runs, so timings are noisy), torch {m['torch']}, vllm {m['vllm']}. Each row is one "
        "`torchrun --nproc-per-node 2 -m torchrl_post.train` run (FSDP over 2 CPU ranks, in-process vLLM, GRPO "
        "on the demo data, validation and checkpoints off); full fine-tuning uses configs/config.yaml (lr 5e-4), "
        f"LoRA configs/lora.yaml (rank {LORA_RANK}, alpha {LORA_ALPHA}, all-linear, lr 2e-3). Times and sync "
        f"bytes: medians over steps {FIRST_STEP}..N. Optimizer state: AdamW's two float32 moments per trainable "
        "parameter, both ranks together (FSDP shards it, so each rank holds half).",
        "",
    ]
    for model in rec["models"]:
        lines += [
            f"## {model['name']} ({model['params']['full']['total_params'] / 1e6:.2f}M parameters, "
            f"{model['steps']} steps)",
            "",
            "| mode | trainable params | optimizer state MB | step s | update s | sync s | sync MB | gen s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode in modes_of(model):
            p, r = model["params"][mode], model["runs"][mode]
            lines.append(
                f"| {LABELS[mode]} | {p['trainable_params']:,} | {_mb(p['optimizer_state_bytes'])} | "
                f"{r['step_s']:.3f} | {r['update_s']:.3f} | {r['sync_s']:.4f} | {_mb(r['sync_bytes'])} | "
                f"{r['gen_s']:.3f} |"
            )
        lines.append("")
    lines += [*conclusion(rec), ""]
    return "\n".join(lines)


def conclusion(rec: dict[str, Any]) -> list[str]:
    parts, speed = [], []
    for model in rec["models"]:
        p, r = model["params"], model["runs"]
        parts.append(
            f"{p['lora']['trainable_params'] / p['full']['trainable_params']:.1%} of the parameters and optimizer "
            f"state on {model['name']}"
        )
        speed.append(
            f"{r['lora']['step_s']:.3f} s vs {r['full']['step_s']:.3f} s per step "
            f"(update {r['lora']['update_s']:.3f} vs {r['full']['update_s']:.3f} s) on {model['name']}"
        )
    sync = "; ".join(
        f"{_mb(m['runs']['lora']['sync_bytes'])} vs {_mb(m['runs']['full']['sync_bytes'])} MB and "
        f"{m['runs']['lora']['sync_s']:.3f} vs {m['runs']['full']['sync_s']:.3f} s on {m['name']}"
        for m in rec["models"]
    )
    adapter = "; ".join(
        f"{_mb(m['runs']['lora_adapter']['sync_bytes'])} MB in {m['runs']['lora_adapter']['sync_s']:.3f} s, "
        f"step {m['runs']['lora_adapter']['step_s']:.3f} s on {m['name']}"
        for m in rec["models"]
        if "lora_adapter" in m["runs"]
    )
    return [
        "LoRA trains " + " and ".join(parts) + "; " + "; ".join(speed) + " (LoRA vs full).",
        "The merged sync still moves every weight (the engine reloads W + alpha/r * B @ A): the bytes gathered are "
        "the base weights plus the adapter tensors, so LoRA does not shrink the sync "
        f"({sync}, LoRA vs full; times within noise); LoRA saves optimizer state and weight gradients, not sync traffic.",
        *(
            [
                f"rollout.lora_sync=adapter sends only the adapter ({adapter}); vLLM's CPU LoRA kernels cost generation time."
            ]
            if adapter
            else []
        ),
    ]


def plot(path: Path, rec: dict[str, Any]) -> None:
    plt = common.pyplot()

    models = rec["models"]
    modes = [m for m in MODES if all(m in model["runs"] for model in models)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs = [k + (i - (len(modes) - 1) / 2) * width for k in range(len(models))]
        steps = [m["runs"][mode]["step_s"] for m in models]
        state = [m["params"][mode]["optimizer_state_bytes"] / 1e6 for m in models]
        for ax, ys, fmt in ((left, steps, "{:.3f}"), (right, state, "{:.2f}")):
            bars = ax.bar(xs, ys, width, label=LABELS[mode], color=f"C{i}")
            ax.bar_label(bars, [fmt.format(y) for y in ys], fontsize=8)
    names = [f"{m['name']}\n({m['params']['full']['total_params'] / 1e6:.1f}M params)" for m in models]
    for ax, ylabel, title in (
        (left, "seconds", "training step (median)"),
        (right, "MB (log scale)", "AdamW state, both ranks"),
    ):
        ax.set_xticks(range(len(models)), names)
        ax.set(ylabel=ylabel, title=title)
        ax.legend(fontsize=8)
    right.set_yscale("log")
    fig.suptitle("LoRA vs full fine-tuning, GRPO on 2 CPU ranks (FSDP + in-process vLLM)", fontsize=10)
    common.save_figure(fig, path)


# ---- main -----------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    args = common.options(args, parse_args)
    steps = args.steps or (3 if args.tiny else 6 if args.quick else 20)
    big_steps = args.big_steps or 10
    modes = MODES[:2] if args.tiny else MODES
    models = [BenchModel("demo", demo_model(), steps)]
    if not (args.quick or args.tiny):
        models.append(BenchModel("qwen2-25m", big_model(), big_steps))
    records = []
    for model in models:
        done = {mode: train(model, mode) for mode in modes}
        runs, params = {m: d[0] for m, d in done.items()}, {m: d[1] for m, d in done.items()}
        path = str(model.path.relative_to(ROOT))
        records.append({"name": model.name, "path": path, "steps": model.steps, "params": params, "runs": runs})
    rec = {
        "quick": args.quick,
        "tiny": args.tiny,
        "nproc": 2,
        "lora_rank": LORA_RANK,
        "lora_alpha": LORA_ALPHA,
        "median_from_step": FIRST_STEP,
        "models": records,
        "loadavg_1m": common.load_1m(),
    }
    for line in conclusion(rec):
        print(f"  {line}", flush=True)
    return rec


if __name__ == "__main__":
    common.standalone(sys.modules[__name__])
