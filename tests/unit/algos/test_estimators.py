"""Tests of torchrl_post/algos/estimators.py: step-wise advantages land on each step's own tokens."""

from __future__ import annotations

import pytest
import torch

from tests.unit.stepwise_helpers import R, _trajectories
from torchrl_post.agent.base import steps_to_batch
from torchrl_post.algos.estimators import estimate_advantages
from torchrl_post.config.schema import AlgorithmConfig


@pytest.mark.parametrize("mode", ["broadcast", "per_step"])
def test_step_advantage_lands_on_its_own_tokens(mode: str) -> None:
    batch = steps_to_batch(_trajectories(), pad_id=0)
    assert batch.traj_ids.tolist() == [0, 0, 1, 1] and batch.step_ids.tolist() == [0, 1, 0, 1]
    assert batch.scores.tolist() == [1.0, 1.0, 0.0, 0.0] and batch.step_rewards.tolist() == [0.0, 1.0, 0.0, 0.0]
    # Each row: its own context as the prompt, only its own response trained.
    assert batch.loss_mask.sum(-1).tolist() == [3.0, 1.0, 1.0, 2.0]
    cfg = AlgorithmConfig()
    cfg.stepwise_advantage.enable, cfg.stepwise_advantage.mode = True, mode
    estimate_advantages(cfg, batch, kl_coef=0.0)
    adv = batch.advantages
    assert adv is not None
    assert ((adv != 0) == batch.loss_mask.bool()).all(), "an advantage is zeroed or leaks outside its step's tokens"
    # broadcast: A (reward 1) vs B (0). per_step, gamma 1: A's returns [1, 1], B's [0, 0]: +-R at each step.
    expected = [R, R, -R, -R]
    for row, value in enumerate(expected):
        torch.testing.assert_close(
            adv[row][batch.loss_mask[row].bool()],
            torch.full_like(adv[row][batch.loss_mask[row].bool()], value),
            atol=1e-5,
            rtol=0,
        )
