"""Metrics out: metrics.jsonl (always, one object per step) and the loggers `trainer.logger` lists:

- console: one line per step on stdout; on a terminal also a progress bar (tqdm) with the lines above it.
- wandb: a W&B run under `{run_dir}/wandb/`; `WANDB_MODE=offline` keeps it on disk, no network (`wandb sync`
  uploads it later).
- tensorboard: event files under `{run_dir}/tensorboard/`, one scalar per metrics.jsonl key.

Only rank 0 writes. On resume, rows logged after the resumed step are dropped first (and TensorBoard purges
them), so metrics.jsonl stays one consistent history across restarts.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import netrc
import os
import sys
from pathlib import Path
from typing import Any, get_args

from torchrl_post.config.enums import Logger
from torchrl_post.config.errors import ConfigError, TrainingError
from torchrl_post.logging.progress import RunProgress, stdout_is_terminal
from torchrl_post.logging.tensorboard import TensorBoardLogger

log = logging.getLogger("torchrl_post")
LOGGERS = get_args(Logger)  # besides metrics.jsonl, always written
PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard"}  # logger -> the package it needs


def check_loggers(loggers: list[str]) -> None:
    """Known names whose packages are installed; else one ConfigError naming trainer.logger."""
    for name in loggers:
        if name not in LOGGERS:
            raise ConfigError(f"trainer.logger={name!r} is not one of {', '.join(LOGGERS)}")
        package = PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"trainer.logger lists {name} but the {package} package is not installed (pip install {package})"
            )
    if "wandb" in loggers and not _wandb_credentials():
        raise ConfigError(
            "trainer.logger lists wandb (WANDB_MODE=online) but W&B has no API key; run `wandb login` or set "
            "WANDB_API_KEY, or set WANDB_MODE=offline to keep the run in the run directory (`wandb sync` uploads "
            "it later)"
        )


def _wandb_credentials() -> bool:
    """Whether W&B can start without asking: a mode that needs no key, WANDB_API_KEY, or `wandb login`'s netrc
    entry (checked before any model loads; `wandb.init` would fail only after they have)."""
    if os.environ.get("WANDB_MODE", "online") in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _init_wandb(run_dir: Path, project: str, experiment: str, config: dict[str, Any]) -> Any:
    import wandb

    try:
        return wandb.init(project=project, name=experiment, config=config, dir=str(run_dir))
    except (wandb.errors.UsageError, wandb.errors.CommError) as e:  # no API key, no network (online), ...
        mode = os.environ.get("WANDB_MODE", "online")
        raise ConfigError(
            f"trainer.logger lists wandb (WANDB_MODE={mode}) but W&B could not start: {' '.join(str(e).split())}; "
            f"run `wandb login` or set WANDB_API_KEY, or set WANDB_MODE=offline to keep the run under "
            f"{run_dir}/wandb (no network; `wandb sync` uploads it later)"
        ) from e


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
        check_loggers(loggers)  # on every rank, so a missing package stops them all alike
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self.console = "console" in loggers
        self.total_steps = total_steps
        self.wandb: Any = None
        self.tensorboard = TensorBoardLogger(run_dir, config) if enabled and "tensorboard" in loggers else None
        # The bar starts with the first row, once the resumed step is known.
        self.bar_wanted = enabled and self.console and stdout_is_terminal()
        self.bar: RunProgress | None = None
        self.first_step = 0
        if enabled:
            run_dir.mkdir(parents=True, exist_ok=True)
            if "wandb" in loggers:
                self.wandb = _init_wandb(run_dir, project, experiment, config)

    def start_fresh(self) -> None:
        """A run starting at step 0 in a directory with history keeps that history aside, never deletes it."""
        if self.enabled and self.path.exists() and self.path.stat().st_size > 0:
            n = 1
            while (old := self.path.with_name(f"metrics.{n}.jsonl.old")).exists():
                n += 1
            self.path.rename(old)
            log.info("metrics.jsonl of an earlier run moved to %s (this run starts at step 0)", old.name)
        if self.tensorboard is not None:
            self.tensorboard.start_fresh()

    def resume_from(self, step: int) -> None:
        self.first_step = step
        if self.enabled:
            dropped = truncate_history(self.path, step)
            if dropped:
                log.info("metrics.jsonl: dropped %d rows logged after step %d (resumed from there)", dropped, step)
        if self.tensorboard is not None:
            self.tensorboard.resume_from(step)

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
        if self.bar_wanted and self.bar is None:
            self.bar = RunProgress(self.total_steps, self.first_step)
        if self.bar is not None:
            self.bar.write(_console_line(metrics, self.total_steps))
            self.bar.update(metrics)
        elif self.console:
            print(_console_line(metrics, self.total_steps), file=sys.stdout, flush=True)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in clean.items() if v is not None}, step=int(metrics["training/global_step"]))
        if self.tensorboard is not None:
            self.tensorboard.log(clean)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
