"""Tensor-parallel lockstep (engines/lockstep.py) on two gloo ranks with a recording stand-in engine: mirrored
ranks apply their own calls and are checked against the first rank's at every step; a following rank applies the
first rank's; a timing decision is the first rank's everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = pytest.mark.distributed


def test_lockstep_keeps_the_ranks_of_one_engine_alike(tmp_path: Path) -> None:
    assert_ok(torchrun(2, ["tests/distributed/lockstep_worker.py", str(tmp_path)]))
    lead, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    calls = [["add", "a", 7], ["add", "b", 8], ["step"], ["abort", ["a"]], ["step"]]
    assert lead["mirrored"] == other["mirrored"] == calls
    assert (lead["leader"], other["leader"]) == (True, False)
    followed = [["add", "c", 9], ["step"], ["abort", ["c"]], ["add", "d", 10], ["step"]]
    assert lead["followed"] == other["followed"] == followed
    assert lead["followed_steps"] == other["followed_steps"] == 2
    assert lead["agreed"] is other["agreed"] is True
    assert lead["diverged"] == "no error"
    assert "rank 1's requests differ from its engine's first rank at operation 0" in other["diverged"]
    assert "('add', 'f', 11)" in other["diverged"] and "('add', 'e', 11)" in other["diverged"]
