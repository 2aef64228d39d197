"""Asynchronous rollout benchmark: on-policy, look-ahead 1 and partial rollouts (CONFIGS) on a long-tailed task.

Each run: the trainer on 4 ranks (actor [0,1], engines [2,3]) on benchmarks/longtail_task.py, repeat r with trainer.seed
1 + r, runs interleaved; its metrics.jsonl after WARMUP steps gives the rates, idle shares, staleness and validation.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks import common, longtail_task
from benchmarks.common import na

NAME = "async_rollout"
WARMUP = 2  # steps left out of rates and idle shares (engine warm-up; a look-ahead's first batches)
GOAL_SPEEDUP, GOAL_ROLLOUT_IDLE = 1.5, 0.10
STALENESS_BINS = ("0", "1", "2", "3", "4+")
NUMBERS = (  # a run's numbers that `combine` takes the median of
    "step_s", "tokens_per_s", "samples_per_s", "rollout_idle", "actor_idle", "response_length", "score",
    "stale_dropped",
)  # fmt: skip
VAL_N = 4  # validation samples per held-out prompt
LR = 5e-5
PLACEMENT = ("placement.actor=[0,1]", "placement.rollout=[2,3]")
PARTIAL = ("rollout.partial_rollout=true", "trainer.max_off_policy_steps=1")
UNBOUNDED = (*PARTIAL, "trainer.max_staleness=null")
CONFIGS = {  # name: (the table's label, the plot's tick label, overrides)
    "on_policy": ("on-policy", "on-policy", ("trainer.max_off_policy_steps=0",)),
    "lookahead1": ("look-ahead 1", "look-ahead 1", ("trainer.max_off_policy_steps=1",)),
    "partial_s2": ("partial, max_staleness 2", "partial\nstaleness <= 2", (*PARTIAL, "trainer.max_staleness=2")),
    "partial_unbounded": ("partial, unbounded", "partial\nunbounded", UNBOUNDED),
    "partial_arrival": ("partial + update on arrival", "partial\non arrival", (*UNBOUNDED, "rollout.update_on_arrival=true")),
}  # fmt: skip
COLUMNS = [
    ("configuration", "label", "{}"), ("tokens/s", "tokens_per_s", "{:.0f}"), ("x on-policy", "speedup_tokens", "{:.2f}x"),
    ("samples/s", "samples_per_s", "{:.1f}"), ("x on-policy", "speedup_samples", "{:.2f}x"),
    ("response len", "response_length", "{:.1f}"), ("rollout idle", "rollout_idle", "{:.0%}"),
    ("actor idle", "actor_idle", "{:.0%}"), ("staleness 0/1/2/3/4+", "hist", "{}"),
    ("stale dropped", "stale_dropped", "{:.0f}"), ("train score", "score", "{:.3f}"), ("validation", "val_steps", "{}"),
]  # fmt: skip
OPTIONS: common.Options = {
    "--steps": {"type": int, "help": "steps per run (default 20; quick 12; tiny 2)"},
    "--repeats": {"type": int, "help": "interleaved rounds (default 2; quick and tiny 1)"},
    "--configs": {"default": "", "help": f"comma-separated subset of {', '.join(CONFIGS)}"},
    "--prompts": {"type": int, "default": 16, "help": "data.train_batch_size"},
    "--n": {"type": int, "default": 8, "help": "rollout.n"},
}


def summarize(rows: list[dict[str, Any]], samples: int, warmup: int = WARMUP) -> dict[str, Any]:
    """One run's rates and idle shares after `warmup`, staleness histogram and `val` (step -> score) from its rows."""
    steps = [r for r in rows if "timing_s/step" in r]  # validation-only rows have none
    first = min(warmup, len(steps) - 1)
    kept = steps[first:]
    step_s = sum(r["timing_s/step"] for r in kept)
    # A rollout rank's wait in step k's exchanges arrives with step k + 1's row: pair them (the last step has none).
    paired = list(zip(kept, steps[first + 1 :], strict=False))
    waited = sum(nxt.get("timing_s/rollout_wait", 0.0) for _, nxt in paired)
    rollout_idle = waited / sum(r["timing_s/step"] for r, _ in paired) if paired else None
    tokens = sum(samples * (r["prompt_length/mean"] + r["response_length/mean"]) for r in kept)
    hist = {b: sum(r.get(f"rollout/staleness_groups/{b}", 0.0) for r in steps) for b in STALENESS_BINS}
    val = {
        int(r["training/global_step"]): v
        for r in rows
        if (v := next((x for k, x in r.items() if k.startswith("val/test_score/") and k.count("/") == 2), None))
        is not None
    }
    return {
        "measured_steps": len(kept), "step_s": step_s / len(kept), "tokens_per_s": tokens / step_s,
        "samples_per_s": samples * len(kept) / step_s, "rollout_idle": rollout_idle,
        "actor_idle": sum(r.get("timing_s/gen", 0.0) for r in kept) / step_s,
        "response_length": statistics.mean(r["response_length/mean"] for r in steps),
        "score": statistics.mean(r["critic/score/mean"] for r in steps), "staleness_hist": hist,
        "stale_dropped": sum(r.get("rollout/stale_dropped_groups", 0.0) for r in steps), "val": val,
    }  # fmt: skip


def combine(runs: list[dict[str, Any]], reference: dict[str, Any] | None) -> dict[str, Any]:
    """A configuration's repeats in one row; speed-ups against `reference` (on-policy's row; None: this is it)."""
    med = {k: statistics.median(v) if (v := [r[k] for r in runs if r[k] is not None]) else None for k in NUMBERS}
    steps = sorted({s for r in runs for s in r["val"]})
    val = {s: statistics.mean(r["val"][s] for r in runs if s in r["val"]) for s in steps}
    hist = {b: sum(r["staleness_hist"][b] for r in runs) for b in STALENESS_BINS}
    row: dict[str, Any] = {**med, "staleness_hist": hist, "val": val, "val_last": val[steps[-1]] if steps else None}
    ref = reference or row
    row["speedup_tokens"] = row["tokens_per_s"] / ref["tokens_per_s"]
    row["speedup_samples"] = row["samples_per_s"] / ref["samples_per_s"]
    return row


def goal_met(row: dict[str, Any], reference: dict[str, Any], val_noise: float) -> dict[str, bool]:
    """The issue's goal: GOAL_SPEEDUP x on-policy's tokens/s, rollout idle under GOAL_ROLLOUT_IDLE, validation kept."""
    return {
        "speedup": row["speedup_tokens"] >= GOAL_SPEEDUP,
        "rollout_idle": row["rollout_idle"] is not None and row["rollout_idle"] < GOAL_ROLLOUT_IDLE,
        "validation": row["val_last"] is not None and row["val_last"] >= reference["val_last"] - val_noise,
    }


def val_noise(runs: dict[str, list[dict[str, Any]]]) -> float:
    """The largest spread (max - min) of the last validation between one configuration's repeats."""
    spreads = []
    for rs in runs.values():
        last = [r["val"][max(r["val"])] for r in rs if r["val"]]
        if len(last) > 1:
            spreads.append(max(last) - min(last))
    return max(spreads, default=0.0)


def run_one(name: str, repeat: int, args: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    """One training run (trainer.seed 1 + repeat): its `summarize`, wall time and the load average after it."""
    overrides = [
        f"model.path={model}", f"data.train_files={data / 'train.jsonl'}", f"data.val_files={data / 'val.jsonl'}",
        f"data.train_batch_size={args.prompts}", f"rollout.n={args.n}",
        f"data.max_response_length={longtail_task.MAX_RESPONSE_LENGTH}", "data.max_prompt_length=64",
        f"reward.function=benchmarks.longtail_task:{longtail_task.score.__name__}",
        # A tenth of the demo's rate: at 5e-4 every response shrinks to a few tokens within 3 steps (the easy part of
        # the reward: half the prompts ask for at most 4) and the tail the benchmark is about is gone.
        f"actor.lr={LR}", f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={max(1, args.steps // 2)}",
        # sampled validation (temperature 1, 4 per prompt): greedy decoding of this model rarely stops
        "rollout.val_kwargs.do_sample=true", "rollout.val_kwargs.temperature=1.0", f"rollout.val_kwargs.n={VAL_N}",
        f"trainer.val_before_train={'false' if args.tiny else 'true'}", "trainer.plots=false",
        f"trainer.seed={1 + repeat}",  # repeats differ by seed: their spread is the validation's noise
        *PLACEMENT, *CONFIGS[name][2],
    ]  # fmt: skip
    print(f"    {CONFIGS[name][0]}, repeat {repeat} ...", flush=True)
    # One OpenMP thread per process, unbound: 4 processes share the cores with other jobs (benchmarks/rollout.py).
    env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    rows, wall = common.train_run(f"async_rollout_{name}_r{repeat}", overrides, nproc=4, env=env)
    out = {"config": name, "repeat": repeat, **summarize(rows, args.prompts * args.n), "run_wall_s": wall}
    out["loadavg_1m"] = common.load_1m()
    print(f"      {out['tokens_per_s']:.0f} tok/s, rollout idle {na(out['rollout_idle'], '{:.0%}')}; run {wall:.0f} s")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.tiny:
        args.prompts, args.n = 4, 2
    args.steps = args.steps or (2 if args.tiny else 12 if args.quick else 20)
    repeats = args.repeats or (1 if args.tiny or args.quick else 2)
    names = [n for n in args.configs.split(",") if n] or (["on_policy", "partial_s2"] if args.tiny else [])
    configs = [c for c in CONFIGS if not names or c in names]
    model, data = longtail_task.build()
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for repeat in range(repeats):  # interleaved: every configuration once per round
        for c in configs:
            runs[c].append(run_one(c, repeat, args, model, data))
    ref_name = configs[0]
    reference = combine(runs[ref_name], None)
    rows = [
        {"config": c, "label": CONFIGS[c][0], "short": CONFIGS[c][1],
         **(reference if c == ref_name else combine(runs[c], reference))}
        for c in configs
    ]  # fmt: skip
    noise = val_noise(runs)
    for row in rows:
        row["goal"] = goal_met(row, reference, noise)
    settings = {
        "steps": args.steps, "repeats": repeats, "prompts": args.prompts, "n": args.n, "warmup_steps": WARMUP,
        "max_response_length": longtail_task.MAX_RESPONSE_LENGTH, "reference": ref_name,
        "model_warm_start": json.loads((model / "longtail_build.json").read_text()),
    }  # fmt: skip
    return {
        "settings": settings, "rows": rows, "runs": [r for c in configs for r in runs[c]], "val_noise": noise,
        "loadavg_1m": common.load_1m(),
    }  # fmt: skip


def markdown(rec: dict[str, Any]) -> str:
    st, m = rec["settings"], rec["machine"]
    rows = [
        {**r, "hist": " / ".join(f"{r['staleness_hist'][b]:.0f}" for b in STALENESS_BINS),
         "val_steps": ", ".join(f"{v:.3f}" for v in r["val"].values())}
        for r in rec["rows"]
    ]  # fmt: skip
    loads = [r["loadavg_1m"] for r in rec["runs"]]
    per_run = [
        f"- {row['label']}: "
        + ", ".join(
            f"{r['tokens_per_s']:.0f} (load {r['loadavg_1m']:.1f})" for r in rec["runs"] if r["config"] == row["config"]
        )
        for row in rec["rows"]
    ]
    ref, verdicts = rec["rows"][0], []
    for r in rec["rows"][1:]:
        missed = [k for k, ok in r["goal"].items() if not ok]
        verdicts.append(
            f"- {r['label']}: {r['speedup_tokens']:.2f}x on-policy's tokens/s, {r['speedup_samples']:.2f}x its "
            f"samples/s, last validation {r['val_last']:.3f} vs {ref['val_last']:.3f}: "
            f"{'misses' if missed else 'meets'} the goal" + (f" ({', '.join(missed)})." if missed else ".")
        )
    return common.blocks(
        "# Asynchronous rollout on a long-tailed task",
        f"4 processes on {m['cpu_count']} CPU cores shared with other jobs (1-minute load {min(loads):.1f} to "
        f"{max(loads):.1f} after the runs): the actor on ranks [0,1], two vLLM engines on [2,3]; {st['prompts']} "
        f"prompts x {st['n']} samples per step, responses up to {st['max_response_length']} tokens, {st['steps']} "
        f"steps, {st['repeats']} interleaved repeat(s) per configuration (medians; the first {st['warmup_steps']} "
        "steps left out of rates and idle shares). Tokens: prompt plus response tokens trained; idle: "
        "`timing_s/rollout_wait` (the longest-waiting rollout rank, reported a step late) or `timing_s/gen` (the "
        "actor's wait) over `timing_s/step`. Staleness: groups trained per staleness over all runs; validation: mean "
        f"score of {VAL_N} samples (temperature 1) of each of the 128 held-out prompts (mean over repeats, repeat r "
        "with trainer.seed 1 + r).",
        common.table(rows, COLUMNS),
        f"Validation at steps {', '.join(str(s) for s in rec['rows'][0]['val'])}; between the seeds of one "
        f"configuration the last validation varies by up to {rec['val_noise']:.3f} (the noise used below). "
        "Tokens/s of each repeat with the 1-minute load after it:",
        "\n".join(per_run),
        "\n".join(verdicts),
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    rows = rec["rows"]
    fig, axes = common.subplots(1, 4, figsize=(19, 4.6))
    xs, names = list(range(len(rows))), [r.get("short", r["label"]) for r in rows]
    for ax, pairs, goal, goal_label, ylabel, title in (
        (axes[0], (("tokens/s", "speedup_tokens"), ("samples/s", "speedup_samples")), GOAL_SPEEDUP,
         f"goal {GOAL_SPEEDUP:g}x", "x on-policy (median of repeats)", "throughput"),
        (axes[1], (("rollout ranks", "rollout_idle"), ("actor ranks", "actor_idle")), GOAL_ROLLOUT_IDLE,
         "goal (rollout)", "share of the step idle", "idle"),
    ):  # fmt: skip
        common.bars(ax, names, [(label, [r[key] or 0.0 for r in rows]) for label, key in pairs], "", ylabel, title)
        ax.axhline(goal, color="k", ls="--", lw=0.8, label=goal_label)
        ax.set_xticks(xs, names, fontsize=7)
        ax.legend(fontsize=7)
    curves = [(r["label"], [int(s) for s in r["val"]], list(r["val"].values()), f"C{i}o-") for i, r in enumerate(rows)]
    common.lines(axes[2], curves, "validation", xlabel="step", ylabel=f"validation score (sampled, {VAL_N} per prompt)")
    bottoms = [0.0] * len(rows)
    for b in STALENESS_BINS:
        shares = [r["staleness_hist"][b] / max(1.0, sum(r["staleness_hist"].values())) for r in rows]
        axes[3].bar(xs, shares, 0.6, bottom=bottoms, label=f"staleness {b}")
        bottoms = [lo + s for lo, s in zip(bottoms, shares, strict=True)]
    axes[3].set_xticks(xs, names, fontsize=7)
    axes[3].set(ylabel="share of trained groups", title="staleness of the trained groups")
    axes[3].legend(fontsize=7)
    common.save_figure(
        fig, path, "Long-tailed task, actor [0,1] + rollout [2,3]: on-policy, look-ahead and partial rollouts"
    )


if __name__ == "__main__":
    common.standalone()
