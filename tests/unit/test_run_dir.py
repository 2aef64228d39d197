"""The run directory's lock (one job at a time, released by the kernel when its holder dies, SIGKILL too) and
the checkpoint bookkeeping that never loses a file: the pointer is a hint with a fallback, and another
timeline's checkpoints are moved aside, never deleted or overwritten."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchrl_post.checkpoint.dcp import LATEST, Checkpointer
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


def _checkpoint(root: Path, step: int, marker: str = "") -> Path:
    path = root / "checkpoints" / f"global_step_{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "world_size": 1}))
    (path / "marker").write_text(marker or str(step))
    return path


def test_pointer_is_a_hint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ck = Checkpointer(tmp_path, 0, None, 1, barrier=lambda: None)
    for step in (2, 4):
        _checkpoint(tmp_path, step)
    (tmp_path / "checkpoints" / "global_step_6.tmp").mkdir()  # a crash mid-save
    pointer = tmp_path / "checkpoints" / LATEST
    for text in ("garbage\n", "", "9\n"):  # unparsable, truncated, a missing directory
        pointer.write_text(text)
        assert ck.latest() == tmp_path / "checkpoints" / "global_step_4"
    assert "using the newest complete checkpoint on disk, global_step_4" in caplog.text
    pointer.write_text("2\n")
    assert ck.latest() == tmp_path / "checkpoints" / "global_step_2"  # a valid pointer wins


def test_fresh_start_moves_earlier_checkpoints_aside(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, 0, 1, 1, barrier=lambda: None)
    for step in (1, 2):
        _checkpoint(tmp_path, step, f"old {step}")
    (tmp_path / "checkpoints" / LATEST).write_text("2\n")
    dest = ck.set_aside(after=0)
    assert dest == tmp_path / "checkpoints.1.old"
    assert sorted(p.name for p in dest.iterdir()) == ["global_step_1", "global_step_2", LATEST]
    assert (dest / "global_step_2" / "marker").read_text() == "old 2"
    assert list((tmp_path / "checkpoints").iterdir()) == []
    # The new run's checkpoint 1 and pruning (max_keep=1) touch nothing of the old run.
    _checkpoint(tmp_path, 1, "new 1")
    ck._prune()
    assert (dest / "global_step_1" / "marker").read_text() == "old 1"
    assert ck.set_aside(after=1) is None  # nothing later than step 1
    _checkpoint(tmp_path, 3, "other timeline")
    second = ck.set_aside(after=1)
    assert second == tmp_path / "checkpoints.2.old" and (second / "global_step_3").is_dir()


def test_resumed_run_moves_later_checkpoints_and_resets_the_pointer(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, 0, None, 1, barrier=lambda: None)
    for step in (2, 4, 6):
        _checkpoint(tmp_path, step)
    (tmp_path / "checkpoints" / LATEST).write_text("6\n")
    dest = ck.set_aside(after=4)  # resumed from step 4 by resume_path: step 6 is another timeline
    assert dest is not None and sorted(p.name for p in dest.iterdir()) == ["global_step_6"]
    assert (tmp_path / "checkpoints" / LATEST).read_text().strip() == "4"
    assert ck.latest() == tmp_path / "checkpoints" / "global_step_4"


def test_unreadable_state_is_named_and_the_previous_offered(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, 0, None, 1, barrier=lambda: None)
    _checkpoint(tmp_path, 2)
    bad = _checkpoint(tmp_path, 4)
    (bad / "rank_0.pt").write_bytes(b"")
    (bad / "trainer_state.json").write_text('{"global_st')
    with pytest.raises(
        ConfigError, match=r"global_step_4/trainer_state.json cannot be read .*resume_from_path=\S*global_step_2"
    ):
        ck.load(bad, {})
