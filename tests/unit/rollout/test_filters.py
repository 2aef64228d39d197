"""Compact filtering and rejection sampling on hand-built batches (rollout/filters.py)."""

from __future__ import annotations

import torch

from torchrl_post.config.schema import CompactFilteringConfig
from torchrl_post.rollout.filters import compact_filter, masked_reasons, uniform_groups
from torchrl_post.types import Batch, termination_codes


def _batch(scores: list[float], groups: list[int], reasons: list[str]) -> Batch:
    b = len(scores)
    return Batch(
        input_ids=torch.arange(b * 3).view(b, 3),
        attention_mask=torch.ones(b, 3, dtype=torch.long),
        position_ids=torch.arange(3).repeat(b, 1),
        loss_mask=torch.ones(b, 2),
        rollout_log_probs=torch.zeros(b, 2),
        group_ids=torch.tensor(groups),
        termination=termination_codes(reasons),
        weights=torch.ones(b),
        scores=torch.tensor(scores),
    )


def test_masked_reasons_follow_the_flags() -> None:
    assert masked_reasons(CompactFilteringConfig()) == []  # off by default
    on = CompactFilteringConfig(enable=True)
    assert masked_reasons(on) == ["max_prompt_length", "length", "max_turns", "timeout", "error"]
    on.mask_max_response_length_exceeded, on.mask_env_done = False, True
    assert "length" not in masked_reasons(on) and "env_done" in masked_reasons(on)


def test_compact_filter_zeroes_only_the_flagged_samples() -> None:
    b = _batch([1, 0, 1, 0], [0, 0, 1, 1], ["stop", "length", "error", "stop"])
    compact_filter(b, ["length", "error"])
    assert b.weights.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert b.train_mask.sum(-1).tolist() == [2.0, 0.0, 0.0, 2.0]  # they leave every loss denominator


def test_uniform_groups() -> None:
    b = _batch([1, 1, 0, 1, 0, 0], [0, 0, 1, 1, 2, 2], ["stop"] * 6)
    assert uniform_groups(b) == {0, 2}
