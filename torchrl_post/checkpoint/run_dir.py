"""One job per run directory: an exclusive lock held for the job's lifetime.

The job's global rank 0 holds `flock` on `{run_dir}/.torchrl_post.lock`. The kernel drops it when that
process dies, SIGKILL included, so a torchrun restart of the same job (a fresh rank 0) gets it back and a
crashed job never leaves a stale lock. The file names the holder (job id, host, pid, start time) for the
second job's one-line error.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from torchrl_post.config.errors import ConfigError

LOCK_NAME = ".torchrl_post.lock"
_held: dict[Path, int] = {}  # lock file -> open descriptor, kept for the life of the process


def job_id() -> str:
    """The launcher's name for this job: Slurm's job id, else torchrun's run id."""
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or "none"


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return "another job"
    return (
        f"job {info.get('job', '?')} (pid {info.get('pid', '?')} on {info.get('host', '?')}, "
        f"started {info.get('started', '?')})"
    )


def lock_run_dir(run_dir: Path) -> None:
    """Take the run directory for this process (a no-op when already held); ConfigError naming the holder when
    another job has it."""
    path = run_dir / LOCK_NAME
    if path in _held:
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(
            f"trainer.default_local_dir={str(run_dir)!r} cannot be used as a run directory ({e.strerror}); "
            "point it at a writable directory"
        ) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"trainer.default_local_dir={str(run_dir)!r} is in use by {_holder(path)}; give this run its own "
            "directory, or stop that job first (the lock goes with its process)"
        ) from None
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    info = {"job": job_id(), "host": socket.gethostname(), "pid": os.getpid(), "started": stamp}
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(info) + "\n").encode())
    _held[path] = fd


def unlock_run_dir(run_dir: Path) -> None:
    """Release the lock early (tests; a process's exit releases it anyway)."""
    fd = _held.pop(run_dir / LOCK_NAME, None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
