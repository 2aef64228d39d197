"""TRL's SFTTrainer for a few steps, timed: the reference side of benchmarks/sft.py.

    outputs/bench_venvs/trl/bin/python benchmarks/trl_sft_worker.py --model DIR --train FILE.jsonl --out OUT.json \
        [--batch 16] [--lr 1e-3] [--steps 8] [--seed 1]

Runs inside TRL's own virtual environment, one process, no torchrl_post import (shared parts from
benchmarks/trl_worker.py beside it). The rows come tokenised (`input_ids`, `completion_mask`, from torchrl_post's SFT
loader): `completion_only_loss` puts the loss on the completion tokens, as ours. SFTTrainer as the project's run:
`batch` rows per optimizer step, in file order, float32, no gradient checkpointing, no packing, torch AdamW at a
constant learning rate, weight decay 0, clipping at 1.0. Per step the wall time (on_step_begin to on_step_end) and the
logged `loss`; writes one JSON record.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from trl_worker import TRAINING, step_timer, train  # beside this file: the script's directory is on sys.path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("model", "train", "out"):
        ap.add_argument(f"--{name}", type=Path, required=True)
    for name, default in (("batch", 16), ("lr", 1e-3), ("steps", 8), ("seed", 1)):
        ap.add_argument(f"--{name}", type=type(default), default=default)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    dataset = datasets.Dataset.from_list(
        [json.loads(line) for line in args.train.read_text().splitlines() if line.strip()]
    )
    steps: list[dict[str, float]] = []
    logged: list[dict[str, Any]] = []
    t_load = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    load_s = time.perf_counter() - t_load
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
    losses = [float(e["loss"]) for e in logged if "loss" in e]
    print(f"trl sft: {len(steps)} steps, " + ", ".join(f"{s['step_s']:.2f}" for s in steps) + " s", flush=True)
    print("losses: " + ", ".join(f"{x:.4f}" for x in losses), flush=True)


if __name__ == "__main__":
    main()
