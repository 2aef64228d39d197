"""TRL's SFTTrainer for a few steps, timed: the reference side of benchmarks/sft.py.

    outputs/bench_venvs/trl/bin/python benchmarks/trl_sft_worker.py --model DIR --train FILE.jsonl --out OUT.json \
        [--batch 16] [--lr 1e-3] [--steps 8] [--seed 1]

Runs inside TRL's own virtual environment (benchmarks/e2e.py builds it under outputs/bench_venvs/trl), one
process, no torchrl_post import. The training rows come already tokenised (`input_ids` and `completion_mask`,
written by benchmarks/sft.py from torchrl_post's own SFT loader), so both trainers see the same tokens and TRL
skips its tokenisation; `completion_only_loss=True` puts the loss on the completion tokens, as ours does.

SFTTrainer is configured as the project's run: `batch` rows per optimizer step (per_device_train_batch_size,
no gradient accumulation), the rows in file order (train_sampling_strategy="sequential"; ours:
data.shuffle=false), float32 (bf16=False: SFTConfig's default is True), no gradient checkpointing (SFTConfig's
default is True; ours: off), no packing and no padding-free (fixed-length rows have no padding to remove), torch
AdamW at a constant learning rate, weight decay 0, gradient clipping at 1.0.

Per step it records the wall time between on_step_begin and on_step_end (a TrainerCallback) and the logged
`loss`. Writes one JSON record to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--train", type=Path, required=True, help="jsonl of {input_ids, completion_mask}")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t_start = time.perf_counter()
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rows = [json.loads(line) for line in args.train.read_text().splitlines() if line.strip()]
    dataset = datasets.Dataset.from_list(rows)
    steps: list[dict[str, float]] = []
    logged: list[dict[str, Any]] = []

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            steps.append({"step_s": time.perf_counter() - self.t0})

        def on_log(self, *a: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs:
                logged.append(dict(logs))

    t_load = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    load_s = time.perf_counter() - t_load
    with tempfile.TemporaryDirectory(prefix="trl_sft_bench_") as tmp:
        config = SFTConfig(
            output_dir=tmp,
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=1,
            train_sampling_strategy="sequential",
            completion_only_loss=True,
            packing=False,
            padding_free=False,
            max_length=None,
            gradient_checkpointing=False,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            optim="adamw_torch",
            weight_decay=0.0,
            max_grad_norm=1.0,
            max_steps=args.steps,
            logging_steps=1,
            bf16=False,
            fp16=False,
            use_cpu=not torch.cuda.is_available(),
            report_to="none",
            save_strategy="no",
            seed=args.seed,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = SFTTrainer(
            model=model, args=config, train_dataset=dataset, processing_class=tok, callbacks=[StepTimer()]
        )
        t_train = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t_train
    losses = [float(entry["loss"]) for entry in logged if "loss" in entry]
    rec = {
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "datasets": datasets.__version__,
            "python": sys.version.split()[0],
        },
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
        "attn_implementation": model.config._attn_implementation,
        "settings": {
            "per_device_train_batch_size": args.batch,
            "gradient_accumulation_steps": 1,
            "train_sampling_strategy": "sequential",
            "completion_only_loss": True,
            "packing": False,
            "gradient_checkpointing": False,
            "learning_rate": args.lr,
            "lr_scheduler_type": "constant",
            "optim": "adamw_torch",
            "max_grad_norm": 1.0,
            "bf16": False,
        },
        "steps": steps,
        "loss": losses,
        "load_s": load_s,
        "train_s": train_s,
        "wall_s": time.perf_counter() - t_start,
        "pid_env_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"trl sft: {len(steps)} steps, " + ", ".join(f"{s['step_s']:.2f}" for s in steps) + " s", flush=True)
    print("losses: " + ", ".join(f"{x:.4f}" for x in losses), flush=True)


if __name__ == "__main__":
    main()
