"""Checkpoints with torch DCP: `{run_dir}/checkpoints/global_step_N/`.

Layout of one checkpoint:
    actor/, critic/        DCP shards of each trained role: model and optimizer state (each rank its own shard)
    rank_<r>.pt            per-rank state: RNG states, sampler position, LR scheduler (tensors/primitives only)
    trainer_state.json     global step and what wrote it
A checkpoint is written under `global_step_N.tmp` and renamed when every rank has finished; only then is
`latest_checkpointed_iteration.txt` (verl's name) updated. A crash mid-save leaves the previous one whole.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from torchrl_post.config.errors import ConfigError
from torchrl_post.faults import maybe_kill

log = logging.getLogger(__name__)
LATEST = "latest_checkpointed_iteration.txt"
RESUME_MODES = ("auto", "disable", "resume_path")
"""trainer.resume_mode: the latest checkpoint if any, none, or trainer.resume_from_path (loop.resume)."""
Trained = tuple[torch.nn.Module, torch.optim.Optimizer]


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Checkpointer:
    def __init__(
        self,
        run_dir: Path,
        rank: int,
        max_keep: int | None,
        world_size: int | None = None,
        barrier: Callable[[], None] | None = None,
    ) -> None:
        """`rank`/`world_size` are global; `barrier` spans every rank (default: the default group's barrier).
        Role state goes through DCP over each role's own default group (its cell)."""
        self.root = run_dir / "checkpoints"
        self.rank = rank
        self.max_keep = max_keep
        self.world_size = world_size
        self.barrier = barrier or dist.barrier

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def latest(self) -> Path | None:
        """The newest complete checkpoint, by the pointer file (falling back to a directory scan)."""
        pointer = self.root / LATEST
        if pointer.exists():
            path = self.step_dir(int(pointer.read_text().strip()))
            if (path / "trainer_state.json").exists():
                return path
        done = sorted(self._complete(), key=lambda p: int(p.name.split("_")[-1]))
        return done[-1] if done else None

    def _complete(self) -> list[Path]:
        if not self.root.exists():
            return []
        return [p for p in self.root.glob("global_step_*") if p.is_dir() and (p / "trainer_state.json").exists()]

    def save(
        self,
        step: int,
        roles: dict[str, Trained],
        rank_state: dict[str, Any],
        write_extra: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write global_step_N on every rank; `write_extra(tmp_dir)` runs on every rank before the commit."""
        tmp = self.root / f"global_step_{step}.tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        for role, (model, optimizer) in roles.items():
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / role))
        torch.save(rank_state, tmp / f"rank_{self.rank}.pt")
        if write_extra is not None:
            write_extra(tmp)
        maybe_kill("kill_during_save", step, self.rank)
        self.barrier()
        final = self.step_dir(step)
        if self.rank == 0:
            (tmp / "trainer_state.json").write_text(json.dumps({"global_step": step, "world_size": self._world()}))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            pointer_tmp = self.root / (LATEST + ".tmp")
            pointer_tmp.write_text(f"{step}\n")
            pointer_tmp.replace(self.root / LATEST)
            self._prune()
        self.barrier()
        return final

    def _world(self) -> int:
        return self.world_size if self.world_size is not None else dist.get_world_size()

    def _prune(self) -> None:
        if self.max_keep is None:
            return
        done = sorted(self._complete(), key=lambda p: int(p.name.split("_")[-1]))
        for old in done[: -self.max_keep]:
            shutil.rmtree(old, ignore_errors=True)
            log.info("removed old checkpoint %s (trainer.max_ckpt_to_keep=%d)", old.name, self.max_keep)

    def load(self, path: Path, roles: dict[str, Trained]) -> tuple[int, dict[str, Any]]:
        """Restore each role's model and optimizer in place; returns (global step, this rank's saved state)."""
        state_file = path / "trainer_state.json"
        rank_file = path / f"rank_{self.rank}.pt"
        if not state_file.exists() or not rank_file.exists():
            raise ConfigError(f"{path} is not a complete checkpoint (no trainer_state.json or {rank_file.name})")
        meta = json.loads(state_file.read_text())
        if meta["world_size"] != self._world():
            raise ConfigError(
                f"{path} was written by {meta['world_size']} ranks, this run has {self._world()}; "
                "resume with the same number of processes"
            )
        missing = [role for role in roles if not (path / role).is_dir()]
        if missing:
            raise ConfigError(
                f"checkpoint {path} has no state for {missing} (saved without that role); "
                "resume with the same algorithm or set trainer.resume_mode=disable"
            )
        states = {role: get_state_dict(model, optimizer) for role, (model, optimizer) in roles.items()}
        try:
            for role, (model_sd, optim_sd) in states.items():
                dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path / role))  # fills in place
            rank_state = torch.load(rank_file, weights_only=True)
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            raise ConfigError(
                f"checkpoint {path} is corrupted ({' '.join(str(e).split())[:200]}); resume from an earlier one "
                "with trainer.resume_mode=resume_path trainer.resume_from_path=<dir>, or set trainer.resume_mode=disable"
            ) from e
        for role, (model, optimizer) in roles.items():
            model_sd, optim_sd = states[role]
            set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        return int(meta["global_step"]), rank_state
