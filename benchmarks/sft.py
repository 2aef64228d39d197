"""SFT benchmark: our SFT on 1 and 2 ranks against TRL's SFTTrainer (benchmarks/trl_worker.py `--trainer sft`):
same model, rows in the same order (TRL gets the tokens our loader produced), batch, learning rate and steps.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.artefacts import num_params
from benchmarks.common import SIZES, TINY, ModelSize, model_dir
from benchmarks.e2e import TRL_ENV, WORKER, trl_python

NAME = "sft"
RUNS = common.LOGS / "sft"
WARMUP = 1  # steps left out of the throughput (the first step holds allocator warm-up)
SEED = 1


@dataclass(frozen=True)
class Setting:
    """The model, the batch (rows of fixed prompt and response lengths, in tokens), the optimizer and the runs."""

    model: ModelSize
    batch: int
    prompt_len: int
    response_len: int  # the response's tokens with its end-of-sequence token: all of them have loss
    steps: int
    lr: float
    ranks: tuple[int, ...]


SETTINGS = {
    "full": Setting(SIZES["qwen2-10m"], 16, 64, 192, 8, 1e-3, (1, 2)),
    "quick": Setting(SIZES["qwen2-10m"], 8, 64, 128, 5, 1e-3, (1, 2)),
    "tiny": Setting(TINY, 4, 16, 16, 3, 1e-3, (1, 2)),
}
COLUMNS = [
    ("system", "system", "{}"), ("ranks", "ranks", "{}"), ("threads / process", "threads", "{}"),
    ("trained tok/s", "tokens_per_s", "{:.0f}"), ("vs ours 1 rank", "vs_ours_1r", "{:.2f}x"), ("s / step", "step_s", "{:.2f}"),
    ("best tok/s", "best_tokens_per_s", "{:.0f}"), ("step-1 loss", "first_loss", "{:.5f}"),
    ("step-1 diff", "first_loss_diff", "{:+.1e}"), ("final loss", "final_loss", "{:.4f}"), ("load", "loadavg_1m", "{:.1f}"),
]  # fmt: skip
OPTIONS: common.Options = {
    "--steps": {"type": int, "help": "steps per run (default: the mode's)"},
    "--threads": {"type": int, "default": 1, "help": "CPU: torch threads per process"},
    "--no-trl": {"action": "store_true", "help": "measure our side only"},
}


def write_data(s: Setting, rows: int) -> tuple[Path, Path]:
    """(text rows for ours, the same rows tokenised by our SFT loader for TRL), each of s's fixed lengths."""
    from transformers import AutoTokenizer

    from torchrl_post.config.schema import DataConfig, SftConfig
    from torchrl_post.data.sft import load_sft

    rng = random.Random(SEED)
    out = RUNS / f"data_{s.model.name}_b{s.batch}_p{s.prompt_len}_r{s.response_len}_{rows}"
    out.mkdir(parents=True, exist_ok=True)
    text, tokens = out / "train.jsonl", out / "train_tokens.jsonl"
    with text.open("w") as f:
        for _ in range(rows):
            letters = "".join(rng.choices(string.ascii_lowercase, k=s.prompt_len - 1))
            response = (letters * (s.response_len // len(letters) + 1))[: s.response_len - 1]  # + EOS
            f.write(json.dumps({"prompt": letters + ":", "response": response}) + "\n")
    tok = AutoTokenizer.from_pretrained(model_dir(s.model))
    data = DataConfig(
        apply_chat_template=False, max_prompt_length=s.prompt_len, max_response_length=s.response_len, shuffle=False
    )
    ds = load_sft([str(text)], data, SftConfig(truncation="error"), tok, "train")
    with tokens.open("w") as f:
        for p_ids, r_ids, mask in zip(ds.prompt_ids, ds.response_ids, ds.response_masks, strict=True):
            assert (len(p_ids), len(r_ids), sum(mask)) == (s.prompt_len, s.response_len, s.response_len)
            f.write(json.dumps({"input_ids": p_ids + r_ids, "completion_mask": [0] * len(p_ids) + mask}) + "\n")
    return text, tokens


def run_ours(s: Setting, data: Path, ranks: int, threads: int) -> dict[str, Any]:
    """`torchrun -m torchrl_post.train --config-name sft` on `ranks` ranks: per-step times and losses."""
    overrides = [
        "--config-name", "sft", f"model.path={model_dir(s.model)}", f"data.train_files={data}",
        f"data.val_files={data}", f"data.train_batch_size={s.batch}", "data.apply_chat_template=false",
        "data.shuffle=false", f"data.max_prompt_length={s.prompt_len}", f"data.max_response_length={s.response_len}",
        "sft.response_key=response", "sft.truncation=error", f"actor.lr={s.lr}", "actor.lr_scheduler_type=constant",
        "actor.weight_decay=0.0", "actor.grad_clip=1.0", "actor.ppo_epochs=1", f"actor.ppo_mini_batch_size={s.batch}",
        f"actor.ppo_micro_batch_size_per_gpu={s.batch}", "model.use_remove_padding=false",
        "model.enable_gradient_checkpointing=false", f"trainer.total_training_steps={s.steps}", "trainer.test_freq=0",
        "trainer.val_before_train=false", f"trainer.seed={SEED}",
    ]  # fmt: skip
    print(f"    ours: {s.model.name}, {ranks} rank(s), {threads} thread(s) each ...", flush=True)
    env = {"OMP_NUM_THREADS": str(threads)}
    rows, wall = common.train_run(f"sft_{s.model.name}_{ranks}r", overrides, nproc=ranks, env=env)
    rows = [r for r in rows if "timing_s/step" in r]
    return {
        "steps_s": [r["timing_s/step"] for r in rows], "update_s": [r.get("timing_s/update_actor") for r in rows],
        "loss": [r["train/loss"] for r in rows], "throughput_metric": common.median(rows[WARMUP:], "perf/throughput"),
        "run_wall_s": wall,
    }  # fmt: skip


def run_trl(s: Setting, tokens: Path, threads: int, install: bool) -> dict[str, Any] | None:
    """TRL's SFTTrainer in its venv on the same tokens; None when the venv is missing and not to be installed."""
    python = trl_python(install=install)
    if python is None:
        print("    TRL: skipped (no environment at outputs/bench_venvs/trl; a full run builds it)", flush=True)
        return None
    args = {"trainer": "sft", "model": model_dir(s.model), "train": tokens, "batch": s.batch, "lr": s.lr}
    args |= {"steps": s.steps, "seed": SEED}
    print(f"    TRL: {s.model.name}, 1 process, {threads} thread(s) ...", flush=True)
    env = {"OMP_NUM_THREADS": str(threads), **TRL_ENV}
    raw = common.run_worker(f"sft/trl_{s.model.name}", WORKER, 1, args, env, python, wall_key="run_wall_s")
    return {
        "steps_s": [r["step_s"] for r in raw["steps"]], "loss": raw["loss"], "run_wall_s": raw["run_wall_s"],
        **{k: raw[k] for k in ("versions", "settings", "attn_implementation", "torch_threads")},
    }  # fmt: skip


def row(system: str, ranks: int, threads: int, s: Setting, side: dict[str, Any]) -> dict[str, Any]:
    """One system's row: trained tokens/s over the steps after the warm-up, step-1 and final losses."""
    measured = side["steps_s"][WARMUP:]
    seconds = sum(measured)
    return {
        "system": system, "ranks": ranks, "threads": threads,
        "tokens_per_s": s.batch * s.response_len * len(measured) / seconds, "step_s": seconds / len(measured),
        "measured_steps": len(measured), "first_loss": side["loss"][0], "final_loss": side["loss"][-1],
        "run_wall_s": side["run_wall_s"], "loadavg_1m": common.load_1m(), "steps_s": side["steps_s"],
        "loss": side["loss"],
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode(args)
    s = replace(SETTINGS[mode], steps=args.steps) if args.steps else SETTINGS[mode]
    if s.steps <= WARMUP:
        raise SystemExit(f"--steps {s.steps}: need more than the {WARMUP} warm-up step(s)")
    text, tokens = write_data(s, s.batch * s.steps)
    rows = [row("torchrl_post", k, args.threads, s, run_ours(s, text, k, args.threads)) for k in s.ranks]
    trl = None if args.no_trl else run_trl(s, tokens, args.threads, install=mode != "tiny")
    if trl is not None:
        rows.append(row("TRL SFTTrainer", 1, trl["torch_threads"], s, trl))
    for r in rows:
        r["vs_ours_1r"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
        r["first_loss_diff"] = r["first_loss"] - rows[0]["first_loss"]
        print(f"      {r['system']} {r['ranks']}r: {r['tokens_per_s']:.0f} tok/s, loss {r['final_loss']:.4f}")
    return {
        "mode": mode, "setting": {**asdict(s), "model": asdict(s.model)}, "params": num_params(model_dir(s.model)),
        "warmup": WARMUP, "rows": rows, "loadavg_1m": common.load_1m(),
        "trl": {k: trl[k] for k in ("versions", "settings", "attn_implementation")} if trl else None,
    }  # fmt: skip


def conclusion(rows: list[dict[str, Any]]) -> str:
    by = {(r["system"], r["ranks"]): r for r in rows}
    ours, trl, two = by.get(("torchrl_post", 1)), by.get(("TRL SFTTrainer", 1)), by.get(("torchrl_post", 2))
    if ours is None or trl is None:
        return f"Ours on 1 rank: {ours['tokens_per_s']:.0f} trained tokens/s (TRL not measured)." if ours else ""
    text = (
        f"Ours on 1 rank trains {ours['tokens_per_s'] / trl['tokens_per_s']:.2f}x TRL's tokens/s (fastest steps "
        f"{ours['best_tokens_per_s'] / trl['best_tokens_per_s']:.2f}x); step-1 losses (same weights, same rows) differ "
        f"by {abs(trl['first_loss_diff']):.1e}."
    )
    if two is not None:
        best = two["best_tokens_per_s"] / ours["best_tokens_per_s"]
        text += f" On 2 ranks (twice the threads) the fastest steps run {best:.2f}x 1 rank's."
    return text


def markdown(rec: dict[str, Any]) -> str:
    s, m = rec["setting"], rec["machine"]
    versions = (rec.get("trl") or {}).get("versions", {})
    trl = f", TRL {versions.get('trl')} (transformers {versions.get('transformers')})" if versions else ""
    tokens = s["batch"] * s["response_len"]  # `best tok/s`: the fastest step's (other jobs stretch some, not all)
    rows = [r | {"best_tokens_per_s": tokens / min(r["steps_s"][rec["warmup"] :])} for r in rec["rows"]]
    return common.blocks(
        "# SFT benchmark: torchrl_post's SFT against TRL's SFTTrainer",
        f"{s['model']['name']} ({rec['params'] / 1e6:.1f}M parameters, float32, {m['gpu'] or 'cpu'}), {s['batch']} "
        f"rows per step of {s['prompt_len']} prompt + {s['response_len']} response tokens (loss on the "
        f"{s['response_len']}), {s['steps']} steps at lr {s['lr']:g}; {m['cpu_count']} CPUs, torch {m['torch']}{trl}; "
        f"1-minute load average {rec['loadavg_1m']:.1f} at the end. Ours: `--config-name sft` through `torchrun -m "
        "torchrl_post.train` (FSDP2, `nll_loss`), rows in file order. TRL: SFTTrainer on the same tokens, "
        "`completion_only_loss`, sequential sampler, float32, adamw_torch, constant lr. Both: packing off, token-mean "
        "loss, clipping at 1, weight decay 0. trained tok/s = loss tokens of the steps after the first / their wall "
        f"time; `best tok/s` from the fastest of those steps. {rec['rows'][0]['threads']} torch thread(s) per "
        "process. `step-1 diff`: the row's step-1 loss minus ours on 1 rank; `load`: after the row's run.",
        common.table(rows, COLUMNS),
        conclusion(rows),
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    fig, (ax, bx) = common.subplots(1, 2, figsize=(11, 4.2))
    labels = [f"{r['system']}\n{r['ranks']} rank(s)" for r in rec["rows"]]
    bars = ax.bar(labels, [r["tokens_per_s"] for r in rec["rows"]], color=[f"C{i}" for i in range(len(labels))])
    ax.bar_label(bars, [f"{r['tokens_per_s']:.0f}" for r in rec["rows"]], fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set(ylabel="trained tokens / s", title="throughput (steps after the first)")
    styles = [f"C{i}{'osx'[i % 3]}{('-', '--', ':')[i % 3]}" for i in range(len(labels))]  # the lines overlap
    curves = [
        (label.replace("\n", " "), range(1, len(r["loss"]) + 1), r["loss"], style)
        for label, r, style in zip(labels, rec["rows"], styles, strict=True)
    ]
    bx.set(xlabel="step", ylabel="train loss")
    common.lines(bx, curves, "loss per step (same rows, same initial weights; the lines overlap)")
    s = rec["setting"]
    title = (
        f"sft: {s['model']['name']}, {s['batch']} x ({s['prompt_len']} + {s['response_len']}) tokens, lr {s['lr']:g}"
    )
    common.save_figure(fig, path, title)


if __name__ == "__main__":
    common.standalone()
