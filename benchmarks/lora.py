"""LoRA benchmark: LoRA (merged and adapter sync) against full fine-tuning, each a 2-rank trainer run (MODES)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import ROOT, ModelSize, demo_model, model_dir

NAME = "lora"
MODES = ("full", "lora", "lora_adapter")
LABELS = {"full": "full fine-tuning", "lora": "LoRA r16", "lora_adapter": "LoRA r16, adapter sync"}
LORA_RANK, LORA_ALPHA = 16, 32
ADAM_BYTES_PER_PARAM = 2 * 4  # exp_avg and exp_avg_sq in float32
FIRST_STEP = 3  # medians over steps FIRST_STEP..N
BIG = ModelSize("qwen2-25m-lora", 512, 8, 8, 4, 1536)
METRICS = {
    "step_s": "timing_s/step", "update_s": "timing_s/update_actor", "sync_s": "timing_s/sync", "gen_s": "timing_s/gen",
    "sync_bytes": "perf/sync_bytes",  # the bytes gathered for the engine (LoRA: base + adapter tensors)
    "logprob_diff": "rollout/logprob_diff", "score_mean": "critic/score/mean",
}  # fmt: skip
COLUMNS = [
    ("mode", "mode", "{}"), ("trainable params", "trainable_params", "{:,}"), ("optimizer state MB", "state_mb", "{}"),
    ("step s", "step_s", "{:.3f}"), ("update s", "update_s", "{:.3f}"), ("sync s", "sync_s", "{:.4f}"),
    ("sync MB", "sync_mb", "{}"), ("gen s", "gen_s", "{:.3f}"),
]  # fmt: skip

OPTIONS: common.Options = {
    "--steps": {"type": int, "help": "training steps on the demo model (default 20)"},
    "--big-steps": {"type": int, "help": "training steps on the ~25M model (default 10)"},
}


def train(name: str, path: Path, steps: int, mode: str) -> tuple[dict[str, Any], dict[str, int]]:
    """One run's medians (METRICS) and the model's parameters as the trainer wrapped it."""
    overrides = [
        *(["--config-name", "lora", f"model.lora_rank={LORA_RANK}", f"model.lora_alpha={LORA_ALPHA}"] if mode != "full" else []),
        *(["rollout.lora_sync=adapter"] if mode == "lora_adapter" else []),
        f"model.path={path}", f"trainer.total_training_steps={steps}", "trainer.test_freq=0",
    ]  # fmt: skip
    print(f"{name} {LABELS[mode]}: {steps} steps ...", flush=True)
    rows, wall = common.train_run(f"lora_{name}_{mode}", overrides, nproc=2)
    rec: dict[str, Any] = {"steps": len(rows), "median_over_steps": f"{FIRST_STEP}..{len(rows)}", "run_wall_s": wall}
    rec |= common.medians(rows, METRICS, FIRST_STEP) | {"loadavg_1m": common.load_1m()}
    trainable = int(rows[-1]["perf/trainable_params"])
    params = {"total_params": int(rows[-1]["perf/params"]), "trainable_params": trainable}
    return rec, params | {"optimizer_state_bytes": trainable * ADAM_BYTES_PER_PARAM}


def run(args: argparse.Namespace) -> dict[str, Any]:
    models = [("demo", demo_model(), args.steps or (3 if args.tiny else 6 if args.quick else 20))]
    if not (args.quick or args.tiny):
        models.append(("qwen2-25m", model_dir(BIG), args.big_steps or 10))
    records = []
    for name, path, steps in models:
        done = {mode: train(name, path, steps, mode) for mode in (MODES[:2] if args.tiny else MODES)}
        records.append({
            "name": name, "path": str(path.relative_to(ROOT)), "steps": steps,
            "params": {m: d[1] for m, d in done.items()}, "runs": {m: d[0] for m, d in done.items()},
        })  # fmt: skip
    return {
        "quick": args.quick, "tiny": args.tiny, "nproc": 2, "lora_rank": LORA_RANK, "lora_alpha": LORA_ALPHA,
        "median_from_step": FIRST_STEP, "models": records, "loadavg_1m": common.load_1m(),
    }  # fmt: skip


def _mb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.2f}"


def markdown(rec: dict[str, Any]) -> str:
    loads = [r["loadavg_1m"] for model in rec["models"] for r in model["runs"].values()]
    parts = [
        "# LoRA benchmark",
        f"{common.versions(rec, loads)}. Each row is one `torchrun --nproc-per-node 2 -m torchrl_post.train` run (FSDP "
        "on 2 CPU ranks, in-process vLLM, GRPO on the demo data); full fine-tuning: configs/config.yaml (lr 5e-4), "
        f"LoRA: configs/lora.yaml (rank {LORA_RANK}, alpha {LORA_ALPHA}, all-linear, lr 2e-3). Times and sync bytes: "
        f"medians over steps {FIRST_STEP}..N. Optimizer state: AdamW's two float32 moments per trainable parameter, "
        "both ranks together.",
    ]
    share, speed, sync, adapter = [], [], [], []  # the closing paragraph's clauses, one per model
    for model in rec["models"]:
        p, r, name = model["params"], model["runs"], model["name"]
        rows = [{"mode": LABELS[m], **p[m], **r[m]} for m in MODES if m in r]
        rows = [x | {"state_mb": _mb(x["optimizer_state_bytes"]), "sync_mb": _mb(x["sync_bytes"])} for x in rows]
        total = p["full"]["total_params"] / 1e6
        parts += [f"## {name} ({total:.2f}M parameters, {model['steps']} steps)", common.table(rows, COLUMNS)]
        lora, full = r["lora"], r["full"]
        share.append(f"{p['lora']['trainable_params'] / p['full']['trainable_params']:.1%} on {name}")
        speed.append(
            f"{lora['step_s']:.3f} s vs {full['step_s']:.3f} s per step (update {lora['update_s']:.3f} vs "
            f"{full['update_s']:.3f} s) on {name}"
        )
        sync.append(
            f"{_mb(lora['sync_bytes'])} vs {_mb(full['sync_bytes'])} MB, {lora['sync_s']:.3f} vs "
            f"{full['sync_s']:.3f} s on {name}"
        )
        if (a := r.get("lora_adapter")) is not None:
            adapter.append(f"{_mb(a['sync_bytes'])} MB in {a['sync_s']:.3f} s, step {a['step_s']:.3f} s on {name}")
    end = [
        f"LoRA trains {' and '.join(share)} of the parameters and optimizer state; {'; '.join(speed)} (LoRA vs full).",
        "The merged sync still moves every weight (the engine reloads W + alpha/r * B @ A), base weights plus adapter "
        f"tensors ({'; '.join(sync)}, LoRA vs full): LoRA saves optimizer state and gradients, not sync traffic.",
    ]
    if adapter:
        end.append(
            f"rollout.lora_sync=adapter sends only the adapter ({'; '.join(adapter)}); vLLM's CPU LoRA kernels cost "
            "generation time."
        )
    return common.blocks(*parts, "\n".join(end))


def plot(path: Path, rec: dict[str, Any]) -> None:
    models = rec["models"]
    modes = [m for m in MODES if all(m in model["runs"] for model in models)]
    fig, (left, right) = common.subplots(1, 2, figsize=(11, 4.2))
    names = [f"{m['name']}\n({m['params']['full']['total_params'] / 1e6:.1f}M params)" for m in models]
    steps = [(LABELS[mode], [m["runs"][mode]["step_s"] for m in models]) for mode in modes]
    state = [(LABELS[mode], [m["params"][mode]["optimizer_state_bytes"] / 1e6 for m in models]) for mode in modes]
    common.bars(left, names, steps, "{:.3f}", "seconds", "training step (median)")
    common.bars(right, names, state, "{:.2f}", "MB (log scale)", "AdamW state, both ranks")
    right.set_yscale("log")
    common.save_figure(fig, path, "LoRA vs full fine-tuning, GRPO on 2 CPU ranks (FSDP + in-process vLLM)")


if __name__ == "__main__":
    common.standalone()
