"""Tests of torchrl_post/reward/shaping.py: DAPO's overlong penalty and the reward clamp, against hand computation."""

from __future__ import annotations

import pytest
import torch

from torchrl_post.config.schema import OverlongBufferConfig, RewardConfig
from torchrl_post.reward.shaping import clip_scores, last_steps, overlong_penalty, shape_scores, trajectory_lengths
from torchrl_post.types import Batch


def test_overlong_penalty_is_dapos_rule() -> None:
    # verl's tests/special_e2e/run_dapo.sh: max 2048, buffer 128, factor 1.0 -> expected length 1920.
    lengths = torch.tensor([100, 1920, 1921, 1984, 2048])
    penalty = overlong_penalty(lengths, 2048, 128, 1.0)
    # min(-(L - 1920) / 128 * 1.0, 0): 0, 0, -1/128, -64/128, -128/128
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -1 / 128, -0.5, -1.0])
    half = overlong_penalty(lengths, 2048, 128, 0.5)
    assert half.tolist() == pytest.approx([0.0, 0.0, -0.5 / 128, -0.25, -0.5])


def test_overlong_penalty_past_the_maximum_keeps_falling_as_verls() -> None:
    # verl: exceed = 110 - 80 = 30 -> -30 / 20 = -1.5 (TRL's soft punishment would stop at -1)
    assert overlong_penalty(torch.tensor([110]), 100, 20, 1.0).tolist() == pytest.approx([-1.5])


def test_clip_scores() -> None:
    assert clip_scores(torch.tensor([-12.0, -10.0, 0.5, 10.0, 15.0]), 10.0).tolist() == [-10, -10, 0.5, 10, 10]


def test_trajectory_lengths_and_last_steps() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    assert trajectory_lengths(mask, None).tolist() == [2, 1, 4, 3]
    traj, step = torch.tensor([0, 0, 1, 0]), torch.tensor([0, 1, 0, 2])
    assert trajectory_lengths(mask, traj).tolist() == [2 + 1 + 3, 6, 4, 6]
    assert last_steps(traj, step).tolist() == [False, False, True, True]


def _batch(lengths: list[int], scores: list[float]) -> Batch:
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    b = len(lengths)
    return Batch(
        input_ids=torch.zeros(b, 2 + width, dtype=torch.long),
        attention_mask=torch.cat([torch.ones(b, 2), mask], dim=1).long(),
        position_ids=torch.arange(2 + width).expand(b, -1).clone(),
        loss_mask=mask,
        rollout_log_probs=torch.zeros(b, width),
        group_ids=torch.zeros(b, dtype=torch.long),
        termination=torch.zeros(b, dtype=torch.long),
        weights=torch.ones(b),
        scores=torch.tensor(scores),
    )


def test_shape_scores_adds_the_penalty_then_clamps_and_logs_verls_keys() -> None:
    batch = _batch([2, 6, 8, 10], [1.0, 1.0, 0.0, 5.0])
    cfg = RewardConfig(overlong_buffer=OverlongBufferConfig(enable=True, len=4, penalty_factor=1.0), clip=2.0)
    shape_scores(batch, cfg, max_response_length=10)
    # expected length 10 - 4 = 6; penalties: 0, 0, -(8 - 6) / 4 = -0.5, -(10 - 6) / 4 = -1.0
    penalty = [0.0, 0.0, -0.5, -1.0]
    assert batch.reward_extra["overlong_reward"].tolist() == penalty
    assert batch.reward_extra["overlong"].tolist() == [0.0, 0.0, 1.0, 1.0]
    # scores + penalty = 1, 1, -0.5, 4.0; clamped to [-2, 2]
    assert batch.scores is not None and batch.scores.tolist() == [1.0, 1.0, -0.5, 2.0]


def test_shape_scores_max_response_length_of_its_own() -> None:
    batch = _batch([8], [1.0])
    cfg = RewardConfig(overlong_buffer=OverlongBufferConfig(enable=True, len=4, max_response_length=20))
    shape_scores(batch, cfg, max_response_length=10)
    assert batch.scores is not None and batch.scores.tolist() == [1.0], "8 < 20 - 4: no penalty"


def test_shape_scores_off_changes_nothing() -> None:
    batch = _batch([2, 10], [1.0, 30.0])
    shape_scores(batch, RewardConfig(), max_response_length=10)
    assert batch.scores is not None and batch.scores.tolist() == [1.0, 30.0] and batch.reward_extra == {}


def test_shape_scores_of_step_wise_rows_count_the_trajectory_and_penalise_its_last_step() -> None:
    # trajectory 0: steps of 3 and 4 tokens (7 in all); trajectory 1: one step of 2 tokens
    batch = _batch([3, 4, 2], [1.0, 1.0, 1.0])
    batch.traj_ids, batch.step_ids = torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0])
    batch.step_rewards = torch.tensor([0.25, 0.75, 1.0])
    cfg = RewardConfig(overlong_buffer=OverlongBufferConfig(enable=True, len=4, penalty_factor=2.0))
    shape_scores(batch, cfg, max_response_length=8)
    # expected 8 - 4 = 4; trajectory 0: -(7 - 4) / 4 * 2 = -1.5; trajectory 1: 0
    assert batch.scores is not None and batch.scores.tolist() == [-0.5, -0.5, 1.0]
    assert batch.step_rewards.tolist() == [0.25, 0.75 - 1.5, 1.0]
