"""TRL's trainers for a few steps, timed: the peer of benchmarks/e2e.py and tests/gpu (`grpo`), and of sft.py (`sft`).

Runs in TRL's own venv, no torchrl_post import (the reward is loaded by file); float32, torch AdamW at a constant
learning rate, clipping at 1.0; per step the wall time from on_step_begin to on_step_end; one JSON record.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run by path in TRL's venv: benchmarks.common imports the standard library alone
from benchmarks.common import worker_args, write_json  # noqa: E402

PROFILED = {  # TRL profiling name -> our key
    "GRPOTrainer._prepare_inputs": "prepare_s", "GRPOTrainer.transformers.generate": "generate_s",
    "GRPOTrainer._calculate_rewards": "reward_s", "GRPOTrainer.compute_loss": "loss_forward_s",
}  # fmt: skip
REWARD_FILES = {"gsm8k": "torchrl_post/reward/builtin.py", "gsm8k_closeness": "benchmarks/rewards.py"}
# TrainingArguments both workers share: constant lr, torch AdamW, clipping at 1, a log per step, nothing saved
TRAINING = {
    "lr_scheduler_type": "constant", "warmup_steps": 0, "optim": "adamw_torch", "max_grad_norm": 1.0,
    "logging_steps": 1, "fp16": False, "report_to": "none", "save_strategy": "no", "disable_tqdm": True,
    "dataloader_num_workers": 0,
}  # fmt: skip


def load_reward(name: str) -> Callable[..., float]:
    """The reward our side uses, loaded by file (this venv does not have torchrl_post installed)."""
    spec = importlib.util.spec_from_file_location("_rewards", ROOT / REWARD_FILES[name])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn: Callable[..., float] = getattr(module, name)
    return fn


def setup(doc: str | None, argv: list[str] | None, **defaults: Any) -> tuple[Any, float, Any, Any, Any, float]:
    """`worker_args` with --model, --train and `defaults`; then the rows, the tokenizer and the float32 model:
    (args, start time, dataset, tokenizer, model, load seconds)."""
    args = worker_args(doc, argv, model=Path, train=Path, **defaults)
    t_start = time.perf_counter()
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = [json.loads(line) for line in args.train.read_text().splitlines() if line.strip()]
    t_load = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    return args, t_start, datasets.Dataset.from_list(rows), tok, model, time.perf_counter() - t_load


def step_timer(steps: list[dict[str, float]], logged: list[dict[str, Any]], timers: dict[str, float] | None) -> Any:
    """A TrainerCallback: each step's seconds and `timers` (renamed by PROFILED) into `steps`, logs into `logged`."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            if timers is not None:
                timers.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            row = {"step_s": time.perf_counter() - self.t0}
            steps.append(
                row | {key: timers.get(name, 0.0) for name, key in PROFILED.items()} if timers is not None else row
            )

        def on_log(self, *a: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs:
                logged.append(dict(logs))

    return StepTimer()


def train(trainer: Any, out: Path, record: Callable[[], dict[str, Any]], t_start: float, load_s: float) -> None:
    """Run `trainer`, then write `record()` with the versions, device, threads and times to `out`."""
    import datasets
    import torch
    import transformers
    import trl

    t_train = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t_train
    rec = {
        "versions": {
            "trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
            "datasets": datasets.__version__, "python": sys.version.split()[0],
        },
        "device": "cuda" if torch.cuda.is_available() else "cpu", "torch_threads": torch.get_num_threads(), **record(),
        "load_s": load_s, "train_s": train_s, "wall_s": time.perf_counter() - t_start,
        "pid_env_threads": os.environ.get("OMP_NUM_THREADS"),
    }  # fmt: skip
    write_json(out, rec)
    print(f"{len(rec['steps'])} steps, " + ", ".join(f"{s['step_s']:.2f}" for s in rec["steps"]) + " s", flush=True)


def grpo(argv: list[str]) -> None:
    """GRPOTrainer as the project's GRPO step (transformers `generate`); per step TRL's own timers too."""
    args, t_start, dataset, tok, model, load_s = setup(
        grpo.__doc__, argv, prompts=8, n=8, response_length=32, lr=1e-6, steps=6, seed=1, reward=tuple(REWARD_FILES),
        bf16=False,
    )  # fmt: skip
    import torch
    from trl import GRPOConfig, GRPOTrainer
    from trl.extras import profiling

    # TRL's profiling timers log only to wandb/mlflow/trackio; record them here, per step.
    timers: dict[str, float] = defaultdict(float)
    original_log = profiling.ProfilingContext._log_metrics

    def record(self: Any, duration: float) -> None:
        timers[self.name] += duration
        original_log(self, duration)

    profiling.ProfilingContext._log_metrics = record  # type: ignore[method-assign]
    score = load_reward(args.reward)

    def gsm8k(completions: list[Any], answer: list[str], data_source: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score(src, text, ans) for src, text, ans in zip(data_source, texts, answer, strict=True)]

    steps: list[dict[str, float]] = []
    logged: list[dict[str, Any]] = []
    settings = {
        "per_device_train_batch_size": args.prompts * args.n, "num_generations": args.n,
        "max_completion_length": args.response_length, "temperature": 1.0, "beta": 0.0, "num_iterations": 1,
        "learning_rate": args.lr,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="trl_bench_") as tmp:
        config = GRPOConfig(
            output_dir=tmp, top_p=1.0, max_steps=args.steps, bf16=args.bf16, use_cpu=not torch.cuda.is_available(),
            use_vllm=False, seed=args.seed, **settings, **TRAINING,
        )  # fmt: skip
        callbacks = [step_timer(steps, logged, timers)]
        trainer = GRPOTrainer(model=model, reward_funcs=[gsm8k], args=config, train_dataset=dataset,
                              processing_class=tok, callbacks=callbacks)  # fmt: skip
        settings |= {
            "loss_type": config.loss_type, "scale_rewards": config.scale_rewards, "use_vllm": False, "bf16": args.bf16,
            "optim": "adamw_torch", "reward": args.reward,
        }  # fmt: skip
        train(trainer, args.out, lambda: {
            "settings": settings, "steps": steps,
            "reward_mean": [float(e["reward"]) for e in logged if "reward" in e],
            "completion_length_mean": [float(e["completions/mean_length"]) for e in logged if "completions/mean_length" in e],
        }, t_start, load_s)  # fmt: skip


def sft(argv: list[str]) -> None:
    """SFTTrainer on the rows our SFT loader tokenised (`input_ids`, `completion_mask`), in file order."""
    args, t_start, dataset, tok, model, load_s = setup(sft.__doc__, argv, batch=16, lr=1e-3, steps=8, seed=1)
    import torch
    from trl import SFTConfig, SFTTrainer

    steps: list[dict[str, float]] = []
    logged: list[dict[str, Any]] = []
    settings = {
        "per_device_train_batch_size": args.batch, "gradient_accumulation_steps": 1,
        "train_sampling_strategy": "sequential", "completion_only_loss": True, "packing": False,
        "gradient_checkpointing": False, "learning_rate": args.lr,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="trl_sft_bench_") as tmp:
        config = SFTConfig(
            output_dir=tmp, padding_free=False, max_length=None, weight_decay=0.0, max_steps=args.steps, bf16=False,
            use_cpu=not torch.cuda.is_available(), seed=args.seed, **settings, **TRAINING,
        )  # fmt: skip
        callbacks = [step_timer(steps, logged, None)]
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tok, callbacks=callbacks)
        settings |= {"lr_scheduler_type": "constant", "optim": "adamw_torch", "max_grad_norm": 1.0, "bf16": False}
        train(trainer, args.out, lambda: {
            "attn_implementation": model.config._attn_implementation, "settings": settings, "steps": steps,
            "loss": [float(e["loss"]) for e in logged if "loss" in e],
        }, t_start, load_s)  # fmt: skip
    print("losses: " + ", ".join(f"{float(e['loss']):.4f}" for e in logged if "loss" in e), flush=True)


def main(argv: list[str] | None = None) -> None:
    """`--trainer grpo` (the default) or `sft`, then that trainer's flags."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # abbreviated, --train would be --trainer
    ap.add_argument("--trainer", choices=("grpo", "sft"), default="grpo")
    known, rest = ap.parse_known_args(argv)
    (sft if known.trainer == "sft" else grpo)(rest)


if __name__ == "__main__":
    main()
