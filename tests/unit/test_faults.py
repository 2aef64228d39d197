"""Tests of torchrl_post/faults.py: fault specs from TORCHRL_POST_FAULT."""

from __future__ import annotations

import pytest

from torchrl_post.faults import active


def test_fault_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not active("kill_during_save", 4, 0)
    monkeypatch.setenv("TORCHRL_POST_FAULT", "kill_during_save:4:1")
    assert active("kill_during_save", 4, 1) and not active("kill_during_save", 4, 0)
    assert not active("kill_during_save", 3, 1) and not active("nan_advantages", 4, 1)
    monkeypatch.setenv("TORCHRL_POST_FAULT", "nan_advantages:3+")
    assert [active("nan_advantages", s, 0) for s in (2, 3, 9)] == [False, True, True]
