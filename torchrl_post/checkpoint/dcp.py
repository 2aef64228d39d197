"""Checkpoints with torch DCP: `{run_dir}/checkpoints/global_step_N/`.

Layout of one checkpoint:
    actor/, critic/        DCP shards of each trained role: model and optimizer state (each rank its own shard)
    rank_<r>.pt            per-rank state: RNG states, sampler position, LR scheduler (tensors/primitives only)
    trainer_state.json     global step and what wrote it (world size, rollout.partial_rollout: `check_resumable`)
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

from torchrl_post.config.errors import ConfigError, TrainingError
from torchrl_post.faults import maybe_fail_write, maybe_kill

log = logging.getLogger(__name__)
LATEST = "latest_checkpointed_iteration.txt"
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


def partial_rollout_changed(saved: bool, now: bool, checkpoint: Path | None = None) -> ConfigError:
    """The one line for a checkpoint saved with rollout.partial_rollout the other way: its producer state (groups
    carried across steps, or whole batches) is not what this run's producer holds (rollout/groups.py)."""
    held = (
        "groups still generating, carried into the next steps"
        if saved
        else "whole batches only, nothing carried across steps"
    )
    on = "true" if now else "false"
    where = "the checkpoint resumed" if checkpoint is None else f"checkpoint {checkpoint}"
    was = "true" if saved else "false"
    return ConfigError(
        f"rollout.partial_rollout={on}: {where} was saved with rollout.partial_rollout={was} (its "
        f"rollouts hold {held}), which this run cannot resume; set rollout.partial_rollout={was} again, or start a "
        "new run: another trainer.default_local_dir, or trainer.resume_mode=disable (its checkpoints are moved "
        "aside, not deleted)"
    )


def resumed_checkpoint(run_dir: Path, resume_mode: str, resume_from_path: str | None) -> Path | None:
    """The checkpoint a run would resume (trainer.resume_mode), found as `loop.resume` finds it; None: a fresh start."""
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        return Path(resume_from_path or "")
    # rank 1: the pointer's warning, if any, is the real run's to give (rank 0), not the preflight's
    return Checkpointer(run_dir, 1, None, 1, barrier=lambda: None).latest()


def check_resumable(path: Path | None, partial_rollout: bool) -> None:
    """The checkpoint `path` (trainer_state.json) against this run's rollout.partial_rollout, before anything loads
    or is written; a checkpoint without the key (older ones), or none, passes (the producer checks its state too)."""
    if path is None:
        return
    try:
        meta = json.loads((path / "trainer_state.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return  # missing or unreadable: `Checkpointer.load` says so with the fix
    saved = meta.get("partial_rollout") if isinstance(meta, dict) else None
    if isinstance(saved, bool) and saved != partial_rollout:
        raise partial_rollout_changed(saved, partial_rollout, path)


def _step_of(path: Path) -> int:
    """global_step_N (or global_step_N.tmp) -> N; -1 for a name that is not one."""
    tail = path.name.removeprefix("global_step_").removesuffix(".tmp")
    return int(tail) if tail.isdigit() else -1


class Checkpointer:
    def __init__(
        self,
        run_dir: Path,
        rank: int,
        max_keep: int | None,
        world_size: int | None = None,
        barrier: Callable[[], None] | None = None,
        partial_rollout: bool | None = None,
    ) -> None:
        """`rank`/`world_size` are global; `barrier` spans every rank (default: the default group's barrier).
        Role state goes through DCP over each role's own default group (its cell). `partial_rollout`: the run's
        rollout.partial_rollout, written to trainer_state.json (None: not written)."""
        self.root = run_dir / "checkpoints"
        self.rank = rank
        self.max_keep = max_keep
        self.world_size = world_size
        self.barrier = barrier or dist.barrier
        self.partial_rollout = partial_rollout

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def latest(self) -> Path | None:
        """The newest complete checkpoint. The pointer file is a hint: when it is unreadable or names a
        checkpoint that is not there (or not complete), the newest complete one on disk is used, said in one line."""
        pointer = self.root / LATEST
        done = sorted(self._complete(), key=_step_of)
        newest = done[-1] if done else None
        if not pointer.exists():
            return newest
        try:
            text = pointer.read_text().strip()
            path = self.step_dir(int(text))
        except (OSError, UnicodeDecodeError, ValueError):
            problem = f"is unreadable ({pointer.read_bytes()[:20]!r})"
        else:
            if (path / "trainer_state.json").exists():
                return path
            problem = f"names {path.name}, which is not a complete checkpoint"
        if self.rank == 0:
            using = f"using the newest complete checkpoint on disk, {newest.name}" if newest else "no checkpoint found"
            log.warning("%s %s; %s", pointer, problem, using)
        return newest

    def _complete(self) -> list[Path]:
        if not self.root.exists():
            return []
        return [
            p
            for p in self.root.glob("global_step_*")
            if p.is_dir() and p.suffix != ".tmp" and (p / "trainer_state.json").exists()
        ]

    def set_aside(self, after: int) -> Path | None:
        """Move the checkpoints of another timeline out of this run's way (rank 0): every checkpoint after step
        `after` (all of them for a fresh start) goes to `checkpoints.<n>.old/`, nothing is deleted or
        overwritten, and pruning then sees only this run's. Returns where they went (None: nothing to move)."""
        if not self.root.exists():
            return None
        later = [p for p in self.root.glob("global_step_*") if _step_of(p) > after]
        pointer = self.root / LATEST
        if not later and not (after == 0 and pointer.exists()):
            return None
        n = 1
        while (dest := self.root.with_name(f"checkpoints.{n}.old")).exists():
            n += 1
        dest.mkdir()
        for p in later:
            p.rename(dest / p.name)
        if after == 0:
            if pointer.exists():
                pointer.rename(dest / LATEST)
        elif (kept := self.step_dir(after)).is_dir():  # the pointer names what this run resumed from
            pointer.write_text(f"{after}\n")
            log.info("latest checkpoint pointer reset to %s", kept.name)
        names = ", ".join(sorted((p.name for p in later), key=lambda x: int(x.split("_")[-1].removesuffix(".tmp"))))
        log.warning(
            "checkpoints of an earlier run (%s) moved to %s: this run %s; nothing was deleted",
            names or "the latest pointer",
            dest,
            "starts fresh" if after == 0 else f"resumed at step {after}",
        )
        return dest

    def save(
        self,
        step: int,
        roles: dict[str, Trained],
        rank_state: dict[str, Any],
        write_extra: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write global_step_N on every rank; `write_extra(tmp_dir)` runs on every rank before the commit."""
        tmp = self.root / f"global_step_{step}.tmp"
        try:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            self.barrier()
            for role, (model, optimizer) in roles.items():
                model_sd, optim_sd = get_state_dict(model, optimizer)
                dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / role))
            maybe_fail_write("enospc_during_save", step, self.rank)
            torch.save(rank_state, tmp / f"rank_{self.rank}.pt")
            if write_extra is not None:
                write_extra(tmp)
        except (OSError, CheckpointException) as e:  # a full disk, a quota, a vanished mount
            previous = self.latest()
            kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            reason = " ".join(str(e).split())[:200]
            raise TrainingError(
                f"writing checkpoint {tmp} failed ({reason}); {kept}; free space (or fix the mount) and run the "
                "same command to resume"
            ) from e
        maybe_kill("kill_during_save", step, self.rank)
        self.barrier()
        final = self.step_dir(step)
        if self.rank == 0:
            meta: dict[str, Any] = {"global_step": step, "world_size": self._world()}
            if self.partial_rollout is not None:
                meta["partial_rollout"] = self.partial_rollout
            (tmp / "trainer_state.json").write_text(json.dumps(meta))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            pointer_tmp = self.root / (LATEST + ".tmp")
            pointer_tmp.write_text(f"{step}\n")
            pointer_tmp.replace(self.root / LATEST)
            self._prune()
        self.barrier()
        return final

    def _offer(self, bad: Path) -> str:
        """The fix for an unreadable checkpoint: the previous complete one, or a fresh start."""
        earlier = [p for p in sorted(self._complete(), key=_step_of) if _step_of(p) < _step_of(bad)]
        fresh = "start fresh with trainer.resume_mode=disable (its checkpoints are moved aside, not deleted)"
        if not earlier:
            return f"no earlier checkpoint here; {fresh}"
        return (
            f"resume from the previous one with trainer.resume_mode=resume_path "
            f"trainer.resume_from_path={earlier[-1]}, or {fresh}"
        )

    def _world(self) -> int:
        return self.world_size if self.world_size is not None else dist.get_world_size()

    def _prune(self) -> None:
        """Oldest first, never the newest (the pointer names it); `set_aside` made these all this run's."""
        if self.max_keep is None:
            return
        done = sorted(self._complete(), key=_step_of)
        for old in done[: -self.max_keep]:
            shutil.rmtree(old, ignore_errors=True)
            log.info("removed old checkpoint %s (trainer.max_ckpt_to_keep=%d)", old.name, self.max_keep)

    def load(self, path: Path, roles: dict[str, Trained]) -> tuple[int, dict[str, Any]]:
        """Restore each role's model and optimizer in place; returns (global step, this rank's saved state)."""
        state_file = path / "trainer_state.json"
        rank_file = path / f"rank_{self.rank}.pt"
        if not state_file.exists() or not rank_file.exists():
            raise ConfigError(f"{path} is not a complete checkpoint (no trainer_state.json or {rank_file.name})")
        try:
            meta = json.loads(state_file.read_text())
            int(meta["global_step"]), int(meta["world_size"])
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"{state_file} cannot be read ({type(e).__name__}: {e}); {self._offer(path)}") from e
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
                f"checkpoint {path} is corrupted ({' '.join(str(e).split())[:200]}); {self._offer(path)}"
            ) from e
        for role, (model, optimizer) in roles.items():
            model_sd, optim_sd = states[role]
            set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        return int(meta["global_step"]), rank_state
