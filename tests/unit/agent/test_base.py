"""Tests of torchrl_post/agent/base.py: whole-trajectory rows train the responses, not the observations."""

from __future__ import annotations

import torch

from tests.unit.stepwise_helpers import _trajectories
from torchrl_post.agent.base import steps_to_batch, trajectories_to_batch


def test_whole_trajectory_rows_mask_observations() -> None:
    batch = trajectories_to_batch(_trajectories(), pad_id=0)
    # A: responses [3 4 5] + obs [6 7] + [8]: observations attended, not trained.
    assert batch.loss_mask[0, :6].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert batch.response_mask[0, :6].tolist() == [1.0] * 6
    assert batch.turns.tolist() == [2.0, 2.0]


def test_a_trajectory_row_carries_its_last_turn_s_experts_and_a_step_row_its_own() -> None:
    """A recorded turn's experts cover its whole sequence (context + response - 1 positions: its prefill computed
    every one), so a trajectory's row takes its last turn's; a row whose turn recorded none gets -1 (the trainer's
    router chooses there). A: prompt [1 2], tokens 3 4 5 6 7 8: its last turn (context of 7, response of 1)
    records 7 positions, 10 + position here; B's last turn recorded nothing."""
    a, b = _trajectories()
    a.steps[1].routes = torch.arange(10, 17, dtype=torch.int16).view(7, 1, 1)
    a.steps[0].routes = torch.arange(20, 24, dtype=torch.int16).view(4, 1, 1)  # [1 2] + [3 4 5] - 1
    batch = trajectories_to_batch([a, b], pad_id=0)
    assert batch.routed_experts is not None and batch.routed_experts.shape[:3] == (2, 1, 1)
    routed = batch.routed_experts[:, 0, 0]
    assert routed[0][batch.attention_mask[0].bool()].tolist() == [*range(10, 17), -1]  # the last token routes nothing
    assert (routed[1] == -1).all()
    steps = steps_to_batch([a, b], pad_id=0)
    assert steps.routed_experts is not None
    first = steps.routed_experts[0, 0, 0][steps.attention_mask[0].bool()]
    assert first.tolist() == [20, 21, 22, 23, -1]
    assert (steps.routed_experts[2:, 0, 0] == -1).all()  # B's steps recorded none
    assert trajectories_to_batch(_trajectories(), pad_id=0).routed_experts is None  # nothing recorded anywhere
