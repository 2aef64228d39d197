"""What a rank runs each step, whatever its roles: the protocol `loop.fit` drives.

`Trainer` (trainer.py) on the actor's ranks, `RolloutServer` (rollout/remote.py) on rollout-only ranks,
`RoleServer` (workers/remote.py) on critic/reference-only ranks. `build.build_program` picks one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from torchrl_post.checkpoint.dcp import Trained
from torchrl_post.data.dataset import PromptDataset

VAL_TOTALS = 3
"""Rows of a validation total: score sum, sample count, best-of-n sum (see EngineSource.validation_totals)."""


def no_validation(sources: list[str]) -> torch.Tensor:
    """The validation totals of a rank without an engine."""
    return torch.zeros(VAL_TOTALS, len(sources), dtype=torch.float64)


class RankProgram(Protocol):
    """One rank's part of every step; `loop.fit` drives it."""

    def step(self, step: int) -> dict[str, float]:
        """Global step `step` (from 1); metrics on the actor's ranks, {} elsewhere."""
        ...

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        """[VAL_TOTALS, sources] score sums, counts and best-of-n sums this rank contributes (zeros without an
        engine)."""
        ...

    def val_samples(self) -> list[dict[str, Any]]:
        """The last validation's samples this rank keeps for trainer.log_val_generations ([] elsewhere)."""
        ...

    def trained_roles(self) -> dict[str, Trained]: ...

    def state_dict(self) -> dict[str, Any]:
        """This rank's checkpoint state besides the DCP shards of its trained roles."""
        ...

    def load_state_dict(self, state: dict[str, Any], step: int) -> None: ...

    def after_resume(self) -> None:
        """Bring the engines up to the trainer's weights: after a resume, and at a fresh start (engines that
        start with rollout.load_format=dummy have none yet)."""
        ...

    def write_hf(self, ckpt_tmp: Path) -> None: ...

    def shutdown(self, process_ends: bool = False) -> None: ...
