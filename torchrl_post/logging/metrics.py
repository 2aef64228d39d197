"""Metrics out: metrics.jsonl (always, one object per step), a console line per step, and wandb.

Only rank 0 writes. On resume, rows logged after the resumed step are dropped first, so metrics.jsonl
stays one consistent history across restarts.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from torchrl_post.config.errors import TrainingError

log = logging.getLogger("torchrl_post")
LOGGERS = ("console", "wandb")  # besides metrics.jsonl, always written


def truncate_history(path: Path, keep_through_step: int) -> int:
    """Drop rows whose training/global_step is after `keep_through_step`; returns how many were dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            step = json.loads(line).get("training/global_step", 0)
        except json.JSONDecodeError:
            dropped += 1  # a row cut short by a crash
            continue
        if step <= keep_through_step:
            kept.append(line)
        else:
            dropped += 1
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)
    return dropped


def _console_line(m: dict[str, float], total: int) -> str:
    step = int(m.get("training/global_step", 0))
    parts = [f"step {step}/{total}"]
    for key, label, fmt in (
        ("critic/score/mean", "reward", "{:.3f}"),
        ("response_length/mean", "resp_len", "{:.1f}"),
        ("actor/loss", "loss", "{:+.4f}"),
        ("actor/entropy", "entropy", "{:.3f}"),
        ("timing_s/step", "step_s", "{:.2f}"),
    ):
        if key in m:
            parts.append(f"{label} " + fmt.format(m[key]))
    parts += [
        f"{k.removeprefix('val/test_score/')} val {v:.3f}" for k, v in m.items() if k.startswith("val/test_score/")
    ]
    return " | ".join(parts)


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        loggers: list[str],
        enabled: bool,
        total_steps: int,
        config: dict[str, Any],
        project: str,
        experiment: str,
    ) -> None:
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self.console = "console" in loggers
        self.total_steps = total_steps
        self.wandb: Any = None
        if enabled:
            run_dir.mkdir(parents=True, exist_ok=True)
            if "wandb" in loggers:
                import wandb

                self.wandb = wandb.init(project=project, name=experiment, config=config, dir=str(run_dir))

    def start_fresh(self) -> None:
        """A run starting at step 0 in a directory with history keeps that history aside, never deletes it."""
        if self.enabled and self.path.exists() and self.path.stat().st_size > 0:
            n = 1
            while (old := self.path.with_name(f"metrics.{n}.jsonl.old")).exists():
                n += 1
            self.path.rename(old)
            log.info("metrics.jsonl of an earlier run moved to %s (this run starts at step 0)", old.name)

    def resume_from(self, step: int) -> None:
        if self.enabled:
            dropped = truncate_history(self.path, step)
            if dropped:
                log.info("metrics.jsonl: dropped %d rows logged after step %d (resumed from there)", dropped, step)

    def log(self, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        clean = {
            k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items() if not k.startswith("_")
        }
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(clean) + "\n")
        except OSError as e:  # a full disk or a quota: the rows written so far and the checkpoints stay
            raise TrainingError(
                f"cannot write {self.path} ({e.strerror}); the metrics so far and the last checkpoint are kept; "
                "free space and run the same command to resume"
            ) from e
        if self.console:
            print(_console_line(metrics, self.total_steps), file=sys.stdout, flush=True)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in clean.items() if v is not None}, step=int(metrics["training/global_step"]))

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
