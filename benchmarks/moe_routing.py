"""MoE routing benchmark: engine/trainer routing disagreement and what routing replay does to the logprob
difference, each setting (MODES) a 2-rank trainer run; `near_ties`: routers scaled down, experts perturbed.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import DEMO_DATA, DEMO_MODEL, ROOT, na

NAME = "moe_routing"
MOE_MODEL = ROOT / "outputs" / "moe_model_qwen3_moe"
BF16, REPLAY = "rollout.dtype=bfloat16", "actor.router_replay=true"
MODES = {
    "dense": ("dense demo model, engine bf16", [BF16]),
    "moe": ("MoE, engine bf16, no replay", [BF16]),
    "moe_replay": ("MoE, engine bf16, router replay", [BF16, REPLAY]),
    "moe_fp32": ("MoE, engine float32, no replay", []),
    "ties": ("MoE with near-tie routers, engine bf16, no replay", [BF16]),
    "ties_replay": ("MoE with near-tie routers, engine bf16, router replay", [BF16, REPLAY]),
}
TIES_MODEL = common.MODELS / "moe_near_ties"
ROUTER_SCALE, EXPERT_NOISE = 0.05, 0.5
METRICS = {"logprob_diff": "rollout/logprob_diff", "router_mismatch": "rollout/router_mismatch"}
COLUMNS = [("setting", "label", "{}"), ("router mismatch", "mismatch", "{}"), ("logprob diff", "logprob_diff", "{:.2e}"),
           ("vs dense", "ratio", "{}")]  # fmt: skip
OPTIONS: common.Options = {"--steps": {"type": int, "help": "training steps per setting (default 12)"}}


def near_ties(moe: Path) -> Path:
    """The stress variant of the MoE demo model (module doc), built once under outputs/bench_models."""
    if (TIES_MODEL / "config.json").is_file():
        return TIES_MODEL
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from torchrl_post.demo.build import save_model

    model = AutoModelForCausalLM.from_pretrained(moe, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(ROUTER_SCALE)
            elif ".mlp.experts." in name:
                p.mul_(1 + EXPERT_NOISE * torch.randn(p.shape, generator=gen))
    save_model(model, AutoTokenizer.from_pretrained(moe), TIES_MODEL)
    return TIES_MODEL


def train(mode: str, model: Path, steps: int) -> dict[str, Any]:
    overrides = [
        f"model.path={model}", f"data.train_files={DEMO_DATA / 'train.jsonl'}",
        f"data.val_files={DEMO_DATA / 'val.jsonl'}", f"trainer.total_training_steps={steps}", "trainer.test_freq=0",
        "trainer.max_logprob_diff=0",  # the bf16 engine's difference is the point here, not a warning
        *MODES[mode][1],
    ]  # fmt: skip
    print(f"{MODES[mode][0]}: {steps} steps ...", flush=True)
    rows, wall = common.train_run(f"moe_routing_{mode}", overrides, nproc=2)
    steps_rows = [r for r in rows if r.get("training/global_step", 0) >= 1]
    per_step = {key: [r.get(metric) for r in steps_rows] for key, metric in METRICS.items()}
    rec: dict[str, Any] = {"mode": mode, "label": MODES[mode][0], "run_wall_s": wall, "per_step": per_step}
    for key, values in per_step.items():
        known = [float(v) for v in values if v is not None]
        rec[key] = statistics.mean(known) if known else None
    return rec | {"loadavg_1m": common.load_1m()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from torchrl_post.demo.moe import build_moe

    steps = args.steps or (2 if args.tiny else 6 if args.quick else 12)
    build_moe(MOE_MODEL, DEMO_MODEL, DEMO_DATA)  # the dense demo model and data first (`make moe-model`)
    ties = near_ties(MOE_MODEL)
    models = {"dense": DEMO_MODEL, "ties": ties, "ties_replay": ties}
    return {"steps": steps, "runs": [train(mode, models.get(mode, MOE_MODEL), steps) for mode in MODES]}


def markdown(rec: dict[str, Any]) -> str:
    by = {r["mode"]: r for r in rec["runs"]}
    moe, replay, ties, dense = by["moe"], by["moe_replay"], by.get("ties"), by["dense"]["logprob_diff"]
    rows = [r | {"mismatch": na(r["router_mismatch"], "{:.4f}"),
                 "ratio": f"{r['logprob_diff'] / dense:.2f}x" if dense else "n/a"} for r in rec["runs"]]  # fmt: skip
    return common.blocks(
        "# MoE routing: engine/trainer disagreement and routing replay",
        f"{common.versions(rec)}. Each row is one `torchrun --nproc-per-node 2 -m torchrl_post.train` run of "
        f"{rec['steps']} GRPO steps on the demo task (float32 FSDP2 actor on 2 CPU ranks, colocated vLLM). Means "
        "over the steps of `rollout/router_mismatch` (routing decisions, token x MoE layer, where the trainer's "
        "router picks other experts than the engine) and `rollout/logprob_diff` (mean |engine - trainer| logprob "
        "of the sampled tokens), both before the update.",
        common.table(rows, COLUMNS),
        f"Without replay the bf16 engine and the float32 trainer disagree on {na(moe['router_mismatch'], '{:.2%}')} of "
        f"the routing decisions and the logprobs differ by {moe['logprob_diff']:.2e} ({dense and moe['logprob_diff'] / dense:.2f}x "
        f"the dense model's {dense:.2e}); replaying the engine's experts gives {replay['logprob_diff']:.2e} "
        f"({dense and replay['logprob_diff'] / dense:.2f}x). In float32 on both sides the routes disagree on "
        f"{na(by['moe_fp32']['router_mismatch'], '{:.2%}')} of the decisions.",
        (
            "With routers scaled down 20x and more diverse experts the engine and the trainer disagree on "
            f"{na(ties['router_mismatch'], '{:.2%}')} of the decisions (bfloat16's rounding is relative: smaller "
            f"logits do not flip more often); the logprobs differ by {ties['logprob_diff']:.2e} without replay and "
            f"{by['ties_replay']['logprob_diff']:.2e} with it."
        )
        if ties and "ties_replay" in by
        else "",
    )  # fmt: skip


def plot(path: Path, rec: dict[str, Any]) -> None:
    fig, (left, right) = common.subplots(1, 2, figsize=(11, 4.2))
    diff, mismatch = [], []
    for r in rec["runs"]:
        steps = list(range(1, len(r["per_step"]["logprob_diff"]) + 1))
        diff.append((r["label"], steps, r["per_step"]["logprob_diff"], "o-"))
        if r["router_mismatch"] is not None:
            mismatch.append((r["label"], steps, [v or 0.0 for v in r["per_step"]["router_mismatch"]], "o-"))
    common.lines(left, diff, "engine/trainer logprob difference", xlabel="step", ylabel="mean |diff|")
    common.lines(
        right, mismatch, "routing decisions the trainer's router picks differently", xlabel="step", ylabel="fraction"
    )
    common.save_figure(fig, path)


if __name__ == "__main__":
    common.standalone()
