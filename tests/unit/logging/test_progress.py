"""Tests of torchrl_post/logging/progress.py: the progress helper draws a bar on a terminal only."""

from __future__ import annotations

import pytest

from torchrl_post.logging.progress import progress


def test_progress_helper(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert list(progress(range(5), total=5, desc="validation")) == list(range(5))
    assert capsys.readouterr().out == "", "not a terminal: no bar"
    monkeypatch.setattr("torchrl_post.logging.progress.stdout_is_terminal", lambda: True)
    assert list(progress(range(5), total=5, desc="validation")) == list(range(5))
    assert "validation" in capsys.readouterr().out
    assert list(progress(range(5), total=5, desc="validation", enabled=False)) == list(range(5))
    assert capsys.readouterr().out == ""
