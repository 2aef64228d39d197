"""Tests of torchrl_post/checkpoint/dcp.py: checkpoint bookkeeping that never loses a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchrl_post.checkpoint.dcp import LATEST, Checkpointer
from torchrl_post.config.errors import ConfigError


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


def test_trainer_state_records_partial_rollout(tmp_path: Path) -> None:
    """trainer_state.json carries the run's rollout.partial_rollout, which the next run's preflight compares."""
    ck = Checkpointer(tmp_path, 0, None, 1, barrier=lambda: None, partial_rollout=True)
    path = ck.save(3, {}, {"rng": {}})
    assert json.loads((path / "trainer_state.json").read_text()) == {
        "global_step": 3,
        "world_size": 1,
        "partial_rollout": True,
    }
