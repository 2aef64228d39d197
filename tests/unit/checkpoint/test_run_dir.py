"""Tests of torchrl_post/checkpoint/run_dir.py: one job at a time, released when its holder dies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchrl_post.checkpoint.run_dir import LOCK_NAME, lock_run_dir, unlock_run_dir
from torchrl_post.config.errors import ConfigError

HOLD = "import sys, time; from pathlib import Path; from torchrl_post.checkpoint.run_dir import lock_run_dir; "


def _holder(run_dir: Path, then: str) -> subprocess.Popen[str]:
    """A process that takes the lock, says so, then runs `then`."""
    code = HOLD + f"lock_run_dir(Path({str(run_dir)!r})); print('held', flush=True); {then}"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_job_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "time.sleep(60)")
    try:
        with pytest.raises(
            ConfigError, match=rf"default_local_dir='{tmp_path}' is in use by job .* \(pid {holder.pid} "
        ):
            lock_run_dir(tmp_path)
    finally:
        holder.kill()
        holder.wait()


def test_lock_is_released_when_the_holder_is_sigkilled(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    holder.wait()
    assert holder.returncode == -9
    lock_run_dir(tmp_path)  # the kernel dropped the dead holder's lock
    lock_run_dir(tmp_path)  # taking it again in the same process is a no-op
    info = json.loads((tmp_path / LOCK_NAME).read_text())
    assert info["pid"] != holder.pid
    unlock_run_dir(tmp_path)


def test_a_file_in_place_of_the_run_dir_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot be used as a run directory"):
        lock_run_dir(tmp_path / "run")
