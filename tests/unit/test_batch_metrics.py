"""Tests of torchrl_post/batch_metrics.py's reward metrics: verl's critic/score/* and rLLM's critic/full-score/*."""

from __future__ import annotations

import pytest
import torch

from tests.unit.batch_helpers import PAD, _two_prompt_batch
from tests.unit.stepwise_helpers import _trajectories
from torchrl_post.agent.base import steps_to_batch
from torchrl_post.batch_metrics import batch_metrics, behavior_version_metrics, behavior_version_sums
from torchrl_post.logging.reduce import reduce_metrics


def test_single_turn_full_score_is_the_score_mean() -> None:
    batch = _two_prompt_batch()
    batch.scores = torch.tensor([1.0, 0.0, 0.5, 0.25])
    batch.advantages = torch.zeros_like(batch.loss_mask)
    batch.reward_errors = torch.zeros(4)
    m = batch_metrics(batch, [], 1).metrics
    assert m["critic/full-score/mean"] == m["critic/score/mean"] == pytest.approx(1.75 / 4)
    assert (m["critic/full-score/max"], m["critic/full-score/min"]) == (1.0, 0.0)


def test_stepwise_full_score_counts_each_trajectory_once() -> None:
    a, b = _trajectories()  # rewards 1.0 (two steps) and 0.0, cut to one step: three rows
    b.steps = b.steps[:1]
    batch = steps_to_batch([a, b], PAD)
    batch.advantages = torch.zeros_like(batch.loss_mask)
    assert batch.scores is not None and batch.scores.tolist() == [1.0, 1.0, 0.0]  # per row: a mean of 2/3
    m = batch_metrics(batch, [], 1).metrics
    assert m["critic/full-score/mean"] == m["critic/score/mean"] == 0.5
    assert (m["critic/full-score/max"], m["critic/full-score/min"]) == (1.0, 0.0)


def test_behavior_version_metrics_by_hand() -> None:
    """verl's names. Update 3 starts from version 2. Row 0: tokens of versions 0, 1, 1 (then padding), row 1: 2, 2
    (an observation token, version -1, is not trained), row 2: an untrained response. Ages 2, 1, 1, 0, 0: mean 0.8,
    3 of 5 stale, max 2, min 0; row 0 spans two versions, row 1 one: half the covered responses."""
    versions = torch.tensor([[0, 1, 1, -1], [2, -1, 2, -1], [-1, -1, -1, -1]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
    out = reduce_metrics(behavior_version_sums(versions, mask, current=2))
    m = behavior_version_metrics(out, samples=3)
    assert m["training/off_policy/token_staleness/mean"] == pytest.approx(0.8)
    assert m["training/off_policy/token_staleness/stale_fraction"] == pytest.approx(0.6)
    assert out["training/off_policy/token_staleness/max"] == 2 and out["training/off_policy/token_staleness/min"] == 0
    assert m["training/off_policy/cross_version_response_fraction"] == pytest.approx(0.5)
    assert m["training/off_policy/behavior_version/token_coverage"] == 1
    assert m["training/off_policy/behavior_version/response_coverage"] == pytest.approx(2 / 3)
    # Unknown versions reduce coverage and never count as fresh: no staleness without coverage.
    none = reduce_metrics(behavior_version_sums(torch.full((1, 2), -1), torch.ones(1, 2), current=2))
    m = behavior_version_metrics(none, samples=1)
    assert m == {
        "training/off_policy/behavior_version/token_coverage": 0.0,
        "training/off_policy/behavior_version/response_coverage": 0.0,
    }
    assert none == {}
