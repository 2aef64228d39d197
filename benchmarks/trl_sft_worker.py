"""TRL's SFTTrainer for a few steps, timed: the reference side of benchmarks/sft.py (its flags: `main`).

Runs inside TRL's own virtual environment, one process, no torchrl_post import (shared parts from
benchmarks/trl_worker.py beside it). The rows come tokenised (`input_ids`, `completion_mask`, from torchrl_post's SFT
loader): `completion_only_loss` puts the loss on the completion tokens, as ours. SFTTrainer as the project's run:
`batch` rows per optimizer step, in file order, float32, no gradient checkpointing, no packing, torch AdamW at a
constant learning rate, weight decay 0, clipping at 1.0. Per step the wall time (on_step_begin to on_step_end) and the
logged `loss`; writes one JSON record.
"""

from __future__ import annotations

import tempfile
from typing import Any

from trl_worker import TRAINING, setup, step_timer, train  # beside this file: the script's directory is on sys.path


def main(argv: list[str] | None = None) -> None:
    args, t_start, dataset, tok, model, load_s = setup(__doc__, argv, batch=16, lr=1e-3, steps=8, seed=1)
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


if __name__ == "__main__":
    main()
