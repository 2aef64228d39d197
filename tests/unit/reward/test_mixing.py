"""reward/mixing.py against hand computation: weighted sums, GDPO's per-source group standardisation."""

from __future__ import annotations

import math

import pytest
import torch

from torchrl_post.reward.mixing import combine_scores, group_standardized, source_metrics


def test_group_standardized_by_hand() -> None:
    # group 0: 1, 3 (mean 2, unbiased std sqrt(2)); group 1: 5, 5 (std 0: zeros); group 2 alone: 0
    got = group_standardized(torch.tensor([1.0, 3.0, 5.0, 5.0, 9.0]), torch.tensor([0, 0, 1, 1, 2]))
    s = 1 / (math.sqrt(2) + 1e-6)
    assert got.tolist() == pytest.approx([-s, s, 0.0, 0.0, 0.0])


def test_sum_then_normalize_is_the_weighted_sum() -> None:
    sources = {"rule": torch.tensor([1.0, 0.0, 1.0]), "reward_model": torch.tensor([0.5, -2.0, 4.0])}
    got = combine_scores(sources, {"rule": 1.0, "reward_model": 0.25}, torch.tensor([0, 0, 1]), "sum_then_normalize")
    assert got.tolist() == pytest.approx([1.125, -0.5, 2.0])
    only_rm = combine_scores(sources, {"reward_model": 1.0}, torch.tensor([0, 0, 1]), "sum_then_normalize")
    assert only_rm.tolist() == pytest.approx([0.5, -2.0, 4.0])  # a source with weight absent is not read


def test_normalize_then_sum_keeps_a_small_scale_source_from_drowning() -> None:
    # the reward model's scale is 100x the rule's; standardised within the group, each counts alike
    groups = torch.tensor([0, 0, 0, 0])
    rule = torch.tensor([1.0, 0.0, 1.0, 0.0])
    rm = torch.tensor([0.0, 100.0, 200.0, 300.0])
    got = combine_scores(
        {"rule": rule, "reward_model": rm}, {"rule": 1.0, "reward_model": 1.0}, groups, "normalize_then_sum"
    )
    r = (rule - 0.5) / (rule.std() + 1e-6)
    m = (rm - 150.0) / (rm.std() + 1e-6)
    assert got.tolist() == pytest.approx((r + m).tolist(), abs=1e-5)
    assert got.abs().max() < 3  # not the reward model's hundreds


def test_source_metrics_in_one_process() -> None:
    out = source_metrics({"rule": torch.tensor([1.0, 0.0, 1.0, 1.0]), "reward_model": torch.tensor([-1.0, 3.0])})
    assert out == {
        "reward/rule/mean": 0.75, "reward/rule/max": 1.0, "reward/rule/min": 0.0,
        "reward/reward_model/mean": 1.0, "reward/reward_model/max": 3.0, "reward/reward_model/min": -1.0,
    }  # fmt: skip
