"""TensorBoard event files under `{run_dir}/tensorboard/`: one scalar per metrics.jsonl key, at its step.

The tags are metrics.jsonl's keys (verl's names: `actor/loss`, `critic/score/mean`, `timing_s/gen`, ...); a
value that was not finite (null in metrics.jsonl) is left out, as wandb leaves it out. A resumed run opens its
writer with `purge_step` = the resumed step + 1: TensorBoard's reader then drops what an earlier attempt logged
past the checkpoint, as metrics.jsonl drops those rows, so no step shows twice. A fresh start (step 0) in a
directory with event files sets them aside as `tensorboard.N.old/`, beside `metrics.N.jsonl.old`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("torchrl_post")

TB_DIR = "tensorboard"
STEP_KEY = "training/global_step"


class TensorBoardLogger:
    def __init__(self, run_dir: Path, config: dict[str, Any] | None = None) -> None:
        self.dir = run_dir / TB_DIR
        self.config = config
        self.writer: Any = None

    def _open(self, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.close()
        # flush_secs: the default (120 s) would leave a crashed run's last minutes out; log() flushes anyway.
        self.writer = SummaryWriter(log_dir=str(self.dir), purge_step=purge_step, flush_secs=10)

    def start_fresh(self) -> None:
        """Set earlier event files aside (never deleted) and open a new writer; the config goes in as text."""
        if self.dir.is_dir() and any(self.dir.iterdir()):
            n = 1
            while (old := self.dir.with_name(f"{TB_DIR}.{n}.old")).exists():
                n += 1
            self.dir.rename(old)
            log.info("tensorboard/ of an earlier run moved to %s (this run starts at step 0)", old.name)
        self._open(None)
        if self.config:
            text = json.dumps(self.config, indent=1, default=str)
            self.writer.add_text("config", "```\n" + text + "\n```", global_step=0)
            self.writer.flush()

    def resume_from(self, step: int) -> None:
        """Events after `step` (logged before a crash, past the checkpoint) are purged by TensorBoard's reader."""
        self._open(step + 1)
        self.writer.flush()

    def log(self, metrics: dict[str, float | None]) -> None:
        if self.writer is None:
            self._open(None)
        step = int(metrics.get(STEP_KEY) or 0)
        for key, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
