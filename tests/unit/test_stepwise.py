"""Step-wise advantages against hand computation, and on hand-built trajectories: each step's advantage on
that step's own response tokens."""

from __future__ import annotations

import math

import pytest
import torch

from torchrl_post.agent.base import Step, Trajectory, steps_to_batch, trajectories_to_batch
from torchrl_post.algos.estimators import estimate_advantages
from torchrl_post.algos.stepwise import broadcast_advantages, grouped_advantages, per_step_advantages, step_returns
from torchrl_post.config.schema import AlgorithmConfig

R = 1 / math.sqrt(2)  # (r - mean) / unbiased std of two different values


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


def test_grouped_advantages_variable_groups() -> None:
    adv = grouped_advantages(torch.tensor([1.0, 0.0, 3.0, 2.0, 7.0]), torch.tensor([0, 0, 1, 1, 2]), "grpo", False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, 0.0]))
    with pytest.raises(ValueError, match="step-wise"):
        grouped_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), "gae")


def _trajectories() -> list[Trajectory]:
    a = Trajectory(0, {}, prompt=[1, 2], termination="env_done", reward=1.0)
    a.steps = [Step([1, 2], [3, 4, 5], [-0.1] * 3, observation_ids=[6, 7]), Step([1, 2, 3, 4, 5, 6, 7], [8], [-0.2])]
    a.steps[1].reward = 1.0
    b = Trajectory(0, {}, prompt=[1, 2], termination="max_turns", reward=0.0)
    b.steps = [Step([1, 2], [9], [-0.3], observation_ids=[6]), Step([1, 2, 9, 6], [10, 11], [-0.4, -0.5])]
    return [a, b]


@pytest.mark.parametrize("mode", ["broadcast", "per_step"])
def test_step_advantage_lands_on_its_own_tokens(mode: str) -> None:
    batch = steps_to_batch(_trajectories(), pad_id=0)
    assert batch.traj_ids.tolist() == [0, 0, 1, 1] and batch.step_ids.tolist() == [0, 1, 0, 1]
    assert batch.scores.tolist() == [1.0, 1.0, 0.0, 0.0] and batch.step_rewards.tolist() == [0.0, 1.0, 0.0, 0.0]
    # Each row: its own context as the prompt, only its own response trained.
    assert batch.loss_mask.sum(-1).tolist() == [3.0, 1.0, 1.0, 2.0]
    cfg = AlgorithmConfig()
    cfg.stepwise_advantage.enable, cfg.stepwise_advantage.mode = True, mode
    estimate_advantages(cfg, batch, n=2, kl_coef=0.0)
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


def test_whole_trajectory_rows_mask_observations() -> None:
    batch = trajectories_to_batch(_trajectories(), pad_id=0)
    # A: responses [3 4 5] + obs [6 7] + [8]: observations attended, not trained.
    assert batch.loss_mask[0, :6].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert batch.response_mask[0, :6].tolist() == [1.0] * 6
    assert batch.turns.tolist() == [2.0, 2.0]
