"""Reward-model benchmark: scoring colocated with the actor against on a rank of its own (PLACEMENTS), per
reward model (RM_SIZES), each a trainer run with a KL loss (a reference forward per step on the actor's ranks).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.artefacts import num_params
from benchmarks.common import ROOT, demo_model

NAME = "reward_model"
PLACEMENTS = {  # placement: (processes, overrides)
    "colocated": (2, ["placement.reward_model=actor"]),
    "own_rank": (3, ["placement.actor=[0,1]", "placement.reward_model=[2]"]),
}
LABELS = {"colocated": "colocated (actor ranks 0,1)", "own_rank": "own rank (actor 0,1; RM 2)"}
BATCH, N = 16, 8  # data.train_batch_size, rollout.n: the demo config's, stated so the samples per step are known
ENGINE_NAMES = {"vllm": "in-process vLLM", "hf": "transformers generate"}
FIRST_STEP = 3  # medians over steps FIRST_STEP..N (the first two steps hold the warm-up)
METRICS = {
    "rm_start_s": "timing_s/reward_model", "rm_wait_s": "timing_s/wait_reward_model", "step_s": "timing_s/step",
    "gen_s": "timing_s/gen", "rm_mean": "reward/reward_model/mean",  # None would mean nothing was scored
}  # fmt: skip
RM_SIZES: dict[str, dict[str, int]] = {  # name -> the demo model's config with these fields replaced
    "rm-demo": {},
    "rm-qwen2-25m": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
                     "intermediate_size": 1536},
}  # fmt: skip
COLUMNS = [
    ("placement", "label", "{}"), ("RM", "rm", "{}"), ("RM params", "rm_params_m", "{:.2f}M"),
    ("samples/step", "samples_per_step", "{}"), ("RM s (median)", "rm_s", "{:.3f}"),
    ("RM samples/s", "rm_samples_per_s", "{:.0f}"), ("step s (median)", "step_s", "{:.3f}"),
    ("step - RM s", "rest_s", "{:.3f}"), ("gen s", "gen_s", "{:.3f}"),
]  # fmt: skip
OPTIONS: common.Options = {"--steps": {"type": int, "help": "training steps per run (default 12)"}}


def reward_model_dir(name: str) -> Path:
    out = common.MODELS / name
    if common.built(out):
        return out
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    print(f"building the reward model {name} under {out} (once) ...", flush=True)
    demo = demo_model()
    spec = AutoConfig.from_pretrained(demo).to_dict()
    spec.pop("layer_types")  # one per layer: derived again for the new depth
    config = Qwen2Config(**spec | RM_SIZES[name])
    tok = AutoTokenizer.from_pretrained(demo)
    config.num_labels, config.pad_token_id = 1, tok.pad_token_id
    config.architectures = ["Qwen2ForSequenceClassification"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForSequenceClassification(config)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)  # the character tokenizer and its chat template
    return out


def train(name: str, path: Path, placement: str, steps: int, engine: str) -> dict[str, Any]:
    """One run's row: the medians of METRICS, RM samples/s, the rest of the step (step - RM)."""
    nproc, where = PLACEMENTS[placement]
    overrides = [
        "reward_model.enable=true", f"reward_model.model.path={path}", *where,
        f"data.train_batch_size={BATCH}", f"rollout.n={N}", f"rollout.engine={engine}", "actor.use_kl_loss=true",
        f"trainer.total_training_steps={steps}", "trainer.test_freq=0", "trainer.plots=false",
    ]  # fmt: skip
    print(f"{name} {LABELS[placement]}: {steps} steps on {nproc} processes ...", flush=True)
    rows, wall = common.train_run(f"reward_model_{name}_{placement}", overrides, nproc=nproc)
    row: dict[str, Any] = {
        "placement": placement, "rm": name, "rm_params": num_params(path), "nproc": nproc,
        "samples_per_step": BATCH * N, "steps": len(rows), "median_over_steps": f"{FIRST_STEP}..{len(rows)}",
        "run_wall_s": wall, **common.medians(rows, METRICS, FIRST_STEP),
    }  # fmt: skip
    row["rm_s"] = row["rm_start_s"] + row["rm_wait_s"]  # the scoring on the actor's critical path
    row["rm_samples_per_s"] = BATCH * N / row["rm_s"]
    row["rest_s"] = row["step_s"] - row["rm_s"]
    row["loadavg_1m"] = common.load_1m()
    return row


def markdown(rec: dict[str, Any]) -> str:
    rows = [r | {"label": LABELS[r["placement"]], "rm_params_m": r["rm_params"] / 1e6} for r in rec["rows"]]
    ratios = "; ".join(
        f"{h['step_ratio']:.2f}x colocated's step time with {h['rm']} (RM wait {h['rm_ratio']:.2f}x, "
        f"the rest of the step {h['rest_ratio']:.2f}x)"
        for h in rec["headlines"]
    )
    return common.blocks(
        "# Reward-model benchmark",
        f"{common.versions(rec, [r['loadavg_1m'] for r in rec['rows']])}. Each row is one `torchrun -m "
        f"torchrl_post.train` run of the demo GRPO config ({rec['steps']} steps, {ENGINE_NAMES[rec['engine']]}, "
        f"{BATCH} prompts x {N} samples) with a random Qwen2ForSequenceClassification as the only reward "
        f"(`reward_model.micro_batch_size_per_gpu` {rec['rm_micro_batch']}): colocated on the 2 actor ranks, or on "
        f"rank 2 of its own. RM s = `timing_s/reward_model` + `timing_s/wait_reward_model`, medians over steps "
        f"{FIRST_STEP}..N: colocated, each actor rank's forward over its half of the samples; on its own rank, the "
        "part of the scoring the actor's reference forward did not hide.",
        common.table(rows, COLUMNS),
        f"On its own rank: {ratios}.\nThere the scoring overlaps the actor's reference forward (`overlapped: true`): "
        "rank 2 scores the batch while the actor ranks compute their reference logprobs, not generation (whole batches "
        "from the actor's own engine). On these shared CPUs the third process also competes with the actor ranks for "
        "the 2 cores."
        if ratios
        else "",
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    rows = rec["rows"]
    names = list(dict.fromkeys(r["rm"] for r in rows))
    by = {(r["rm"], r["placement"]): r for r in rows}
    placements = [p for p in PLACEMENTS if any(r["placement"] == p for r in rows)]
    params = {r["rm"]: r["rm_params"] for r in rows}
    ticks = [f"{n}\n({params[n] / 1e6:.1f}M params)" for n in names]
    fig, (left, right) = common.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, fmt, ylabel, title in (
        (left, "rm_samples_per_s", "{:.0f}", "samples / s (log scale)",
         "reward-model scoring on the critical path (samples / s)"),
        (right, "step_s", "{:.2f}", "seconds", "training step (median)"),
    ):  # fmt: skip
        series = [(LABELS[p], [by[(n, p)][key] if (n, p) in by else None for n in names]) for p in placements]
        common.bars(ax, ticks, series, fmt, ylabel, title)
    left.set_yscale("log")  # the demo-size model scores ~25x faster than the ~25M one
    common.save_figure(fig, path, f"Reward model colocated vs on its own rank, GRPO {BATCH}x{N} samples per step, CPU")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from torchrl_post.config.schema import RewardModelConfig

    steps = args.steps or (3 if args.tiny else 6 if args.quick else 12)
    names = list(RM_SIZES)[:1] if args.tiny else list(RM_SIZES)
    engine = "hf" if args.tiny else "vllm"
    rows = [train(n, reward_model_dir(n), placement, steps, engine) for n in names for placement in PLACEMENTS]
    by = {(r["rm"], r["placement"]): r for r in rows}
    headlines = []  # per reward model: own rank's step, RM and rest-of-step times over colocated's
    for name in names:
        co, own = by[(name, "colocated")], by[(name, "own_rank")]
        ratios = {f"{k}_ratio": own[f"{k}_s"] / co[f"{k}_s"] for k in ("step", "rm", "rest")}
        headlines.append({"rm": name, "rm_params": co["rm_params"], **ratios})
    return {
        "quick": args.quick, "tiny": args.tiny, "steps": steps, "engine": engine, "median_from_step": FIRST_STEP,
        "train_batch_size": BATCH, "rollout_n": N, "rm_micro_batch": RewardModelConfig().micro_batch_size_per_gpu,
        "models": {n: str(reward_model_dir(n).relative_to(ROOT)) for n in names}, "rows": rows,
        "headlines": headlines, "overlapped": True,
        "overlap_basis": "workers/remote.py: the actor sends the batch after generation and blocks until the scores "
        "return; rank 2 has nothing else to run",
        "loadavg_1m": common.load_1m(),
    }  # fmt: skip


if __name__ == "__main__":
    common.standalone()
