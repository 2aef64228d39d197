"""Tests of torchrl_post/algos/estimators.py: step-wise advantages land on each step's own tokens; whitening over
the whole batch (every rank's rows) and clipping by hand."""

from __future__ import annotations

import pytest
import torch

from tests.unit.batch_helpers import _two_prompt_batch
from tests.unit.stepwise_helpers import R, _trajectories
from torchrl_post.agent.base import steps_to_batch
from torchrl_post.algos.advantages import grpo_advantages, whiten_moments
from torchrl_post.algos.estimators import estimate_advantages
from torchrl_post.config.schema import AlgorithmConfig
from torchrl_post.types import Batch


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


# --- algorithm.whiten_advantages / advantage_clip -----------------------------------------------------------

A = 15**0.5 / 3  # see test_whiten_and_clip_by_hand


def _scored() -> Batch:
    """2 prompts x 2 samples with 2, 4, 0 and 1 response tokens; scores 1, 0 (group 1) and 0.5, 0.5 (group 2);
    the last row filtered out (weight 0)."""
    batch = _two_prompt_batch()
    batch.scores = torch.tensor([1.0, 0.0, 0.5, 0.5])
    batch.weights = torch.tensor([1.0, 1.0, 1.0, 0.0])
    return batch


def test_defaults_leave_the_estimator_s_advantages() -> None:
    batch = _scored()
    assert estimate_advantages(AlgorithmConfig(), batch, kl_coef=0.0) == {}
    assert batch.scores is not None
    expected = grpo_advantages(batch.scores, batch.group_ids, batch.loss_mask)
    assert batch.advantages is not None and torch.equal(batch.advantages, expected)


def test_whiten_and_clip_by_hand() -> None:
    batch = _scored()
    assert batch.loss_mask.sum(-1).tolist() == [2.0, 4.0, 0.0, 1.0]
    cfg = AlgorithmConfig(whiten_advantages=True)
    estimate_advantages(cfg, batch, kl_coef=0.0)
    # GRPO: group 1 gives +a, -a (a = 0.5 / std(1, 0) = 0.7071), group 2 gives 0. Trained tokens: 2 x a, 4 x -a
    # (the weight-0 row's token is not one): mean -a/3; deviations 4a/3 and -2a/3; unbiased var
    # (2 (4a/3)^2 + 4 (2a/3)^2) / 5 = 16a^2/15, so the rows whiten to sqrt(15)/3 = 1.29099 and -sqrt(15)/6.
    adv = batch.advantages
    assert adv is not None
    torch.testing.assert_close(adv[0, :2], torch.full((2,), A), atol=1e-5, rtol=0)
    torch.testing.assert_close(adv[1, :4], torch.full((4,), -A / 2), atol=1e-5, rtol=0)
    assert adv[3].abs().sum().item() == 0.0 and adv[batch.loss_mask == 0].abs().sum().item() == 0.0
    batch = _scored()
    metrics = estimate_advantages(AlgorithmConfig(whiten_advantages=True, advantage_clip=1.0), batch, kl_coef=0.0)
    adv = batch.advantages
    assert adv is not None
    torch.testing.assert_close(adv[0, :2], torch.ones(2))  # 1.29 clamped; -0.645 kept
    torch.testing.assert_close(adv[1, :4], torch.full((4,), -A / 2), atol=1e-5, rtol=0)
    assert metrics == {"critic/advantage_clip_frac": ("mean", 2 / 6)}


def test_whitening_sums_the_moments_over_ranks() -> None:
    """Two ranks holding a prompt each: with their moments summed (what the trainer's all-reduce does) each rank's
    rows whiten to the whole batch's numbers, where a per-rank whitening would not."""
    whole = _scored()
    cfg = AlgorithmConfig(whiten_advantages=True)
    estimate_advantages(cfg, whole, kl_coef=0.0)
    parts = [_scored().select(torch.tensor(rows)) for rows in ([0, 1], [2, 3])]
    moments = []
    for part in parts:  # each rank's own moments of its raw advantages
        raw = part.select(torch.arange(len(part)))
        estimate_advantages(AlgorithmConfig(), raw, kl_coef=0.0)
        assert raw.advantages is not None
        moments.append(whiten_moments(raw.advantages, raw.train_mask))
    for i, part in enumerate(parts):

        def sum_over_ranks(t: torch.Tensor, other: torch.Tensor = moments[1 - i]) -> torch.Tensor:
            return t + other

        estimate_advantages(cfg, part, kl_coef=0.0, sum_over_ranks=sum_over_ranks)
        assert part.advantages is not None and whole.advantages is not None
        torch.testing.assert_close(part.advantages, whole.advantages[2 * i : 2 * i + 2])


@pytest.mark.parametrize("estimator", ["gae", "reinforce_plus_plus"])
def test_whole_batch_whitening_replaces_the_estimator_s_own(estimator: str) -> None:
    """gae and reinforce_plus_plus whiten anyway: on one rank with every row trained, whiten_advantages=true gives
    the same advantages (one whitening, not two), and the returns stay unwhitened."""
    out = []
    for whiten in (False, True):
        batch = _two_prompt_batch()
        batch.scores = torch.tensor([1.0, 0.0, 0.5, 2.0])
        batch.values = torch.tensor([[0.1, 0.2, 0.0, 0.0], [0.3, -0.2, 0.5, 0.1], [0.0] * 4, [0.4, 0.0, 0.0, 0.0]])
        estimate_advantages(AlgorithmConfig(adv_estimator=estimator, whiten_advantages=whiten), batch, kl_coef=0.0)
        out.append((batch.advantages, batch.returns))
    torch.testing.assert_close(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1])
