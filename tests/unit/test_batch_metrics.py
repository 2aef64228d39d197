"""Tests of torchrl_post/batch_metrics.py's reward metrics: verl's critic/score/* and rLLM's critic/full-score/*."""

from __future__ import annotations

import pytest
import torch

from tests.unit.batch_helpers import PAD, _two_prompt_batch
from tests.unit.stepwise_helpers import _trajectories
from torchrl_post.agent.base import steps_to_batch
from torchrl_post.batch_metrics import batch_metrics


def test_single_turn_full_score_is_the_score_mean() -> None:
    batch = _two_prompt_batch()
    batch.scores = torch.tensor([1.0, 0.0, 0.5, 0.25])
    batch.advantages = torch.zeros_like(batch.loss_mask)
    batch.reward_errors = torch.zeros(4)
    m = batch_metrics(batch, []).metrics
    assert m["critic/full-score/mean"] == m["critic/score/mean"] == pytest.approx(1.75 / 4)
    assert (m["critic/full-score/max"], m["critic/full-score/min"]) == (1.0, 0.0)


def test_stepwise_full_score_counts_each_trajectory_once() -> None:
    a, b = _trajectories()  # rewards 1.0 (two steps) and 0.0, cut to one step: three rows
    b.steps = b.steps[:1]
    batch = steps_to_batch([a, b], PAD)
    batch.advantages = torch.zeros_like(batch.loss_mask)
    assert batch.scores is not None and batch.scores.tolist() == [1.0, 1.0, 0.0]  # per row: a mean of 2/3
    m = batch_metrics(batch, []).metrics
    assert m["critic/full-score/mean"] == m["critic/score/mean"] == 0.5
    assert (m["critic/full-score/max"], m["critic/full-score/min"]) == (1.0, 0.0)
