"""Tests of torchrl_post/algos/stepwise.py: step-wise advantages against hand computation."""

from __future__ import annotations

import torch

from tests.unit.stepwise_helpers import R
from torchrl_post.algos.stepwise import broadcast_advantages, per_step_advantages, step_returns


def test_broadcast_gives_each_step_its_trajectorys_advantage() -> None:
    # Group 0: A (2 steps, reward 1), B (1 step, reward 0); a padding row.
    scores = torch.tensor([1.0, 1.0, 0.0, 5.0])
    group = torch.tensor([0, 0, 0, 0])
    traj = torch.tensor([0, 0, 1, -1])
    adv = broadcast_advantages(scores, group, traj, "grpo")
    torch.testing.assert_close(adv, torch.tensor([R, R, -R, 0.0]), atol=1e-5, rtol=0)
    adv = broadcast_advantages(scores, group, traj, "grpo", normalize_by_steps=True)
    torch.testing.assert_close(adv, torch.tensor([R / 2, R / 2, -R, 0.0]), atol=1e-5, rtol=0)
    # One score per trajectory, not per step: A's two rows do not make it count twice in the mean.
    torch.testing.assert_close(
        broadcast_advantages(scores, group, traj, "grpo", norm_by_std=False)[:3], torch.tensor([0.5, 0.5, -0.5])
    )


def test_per_step_returns_and_groups() -> None:
    # A: rewards [0, 1]; B: [0, 0, 1]; gamma 0.5. Rows deliberately out of order.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    traj = torch.tensor([0, 0, 1, 1, 1])
    step = torch.tensor([1, 0, 0, 2, 1])
    torch.testing.assert_close(step_returns(rewards, traj, step, 0.5), torch.tensor([1.0, 0.5, 0.25, 1.0, 0.5]))
    group = torch.zeros(5, dtype=torch.long)
    adv = per_step_advantages(rewards, group, traj, step, "grpo", gamma=0.5)
    # step 0: A .5 vs B .25; step 1: A 1 vs B .5; step 2: B alone -> 0.
    torch.testing.assert_close(adv, torch.tensor([R, R, -R, 0.0, -R]), atol=1e-5, rtol=0)
    rloo = per_step_advantages(rewards, group, traj, step, "rloo", gamma=0.5)
    torch.testing.assert_close(rloo, torch.tensor([0.5, 0.25, -0.25, 0.0, -0.5]))
