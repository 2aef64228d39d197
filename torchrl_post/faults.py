"""Fault injection for recovery tests, off unless `TORCHRL_POST_FAULT` is set.

    TORCHRL_POST_FAULT=<point>:<step>[+][:<rank>]

`raise_in_step:2` raises an unexpected error in step 2 on every rank (or `<rank>`);
`kill_during_save:4` SIGKILLs each rank (or only `<rank>`) once the step-4 shards are written and before
the checkpoint is committed; `nan_advantages:3+` makes the advantages NaN from step 3 on. The recovery
tests use these to fail at moments no external timer could hit reliably.
"""

from __future__ import annotations

import errno
import os
import signal
import time

from torchrl_post.config.errors import stderr_line


def active(point: str, step: int, rank: int) -> bool:
    spec = os.environ.get("TORCHRL_POST_FAULT", "")
    if not spec:
        return False
    parts = spec.split(":")
    at = parts[1] if len(parts) > 1 else ""
    hit = step >= int(at[:-1]) if at.endswith("+") else at.isdigit() and step == int(at)
    return parts[0] == point and hit and (len(parts) < 3 or int(parts[2]) == rank)


def maybe_kill(point: str, step: int, rank: int) -> None:
    if active(point, step, rank):
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_raise(point: str, step: int, rank: int) -> None:
    """`raise_in_step:2` raises a RuntimeError in step 2 (an unexpected error after every model is built)."""
    if active(point, step, rank):
        raise RuntimeError(f"injected fault {point} at step {step}")


def maybe_signal(point: str, step: int, rank: int) -> None:
    """`sigterm_in_step:2` sends this process SIGTERM at the start of step 2 (what a scheduler does)."""
    if active(point, step, rank):
        os.kill(os.getpid(), signal.SIGTERM)


def maybe_fail_write(point: str, step: int, rank: int) -> None:
    """`enospc_during_save:4` fails the step-4 checkpoint write with ENOSPC, as a full disk does."""
    if active(point, step, rank):
        raise OSError(errno.ENOSPC, "No space left on device")


def maybe_stall(stage: str, step: int, rank: int) -> None:
    """`TORCHRL_POST_STALL=gen:2:1,sync:3:0` SIGSTOPs rank 1 as it enters stage `gen` of step 2 on the first
    attempt, rank 0 entering `sync` of step 3 on the second (torchrun's restart count picks the entry): a frozen
    rank, which never exits and never answers, for the liveness tests (distributed/liveness.py)."""
    spec = os.environ.get("TORCHRL_POST_STALL", "")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    entries = spec.split(",") if spec else []
    if attempt < len(entries) and entries[attempt] == f"{stage}:{step}:{rank}":
        stderr_line(f"fault: rank {rank} stops (SIGSTOP) entering '{stage}' at step {step}")
        time.sleep(0.5)  # a moment into the stage: the liveness thread has published it
        os.kill(os.getpid(), signal.SIGSTOP)
