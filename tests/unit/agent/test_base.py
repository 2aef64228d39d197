"""Tests of torchrl_post/agent/base.py: whole-trajectory rows train the responses, not the observations."""

from __future__ import annotations

from tests.unit.stepwise_helpers import _trajectories
from torchrl_post.agent.base import trajectories_to_batch


def test_whole_trajectory_rows_mask_observations() -> None:
    batch = trajectories_to_batch(_trajectories(), pad_id=0)
    # A: responses [3 4 5] + obs [6 7] + [8]: observations attended, not trained.
    assert batch.loss_mask[0, :6].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert batch.response_mask[0, :6].tolist() == [1.0] * 6
    assert batch.turns.tolist() == [2.0, 2.0]
