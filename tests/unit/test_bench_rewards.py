"""benchmarks/rewards.py: the GSM8K closeness reward both sides of the end-to-end benchmark score with."""

from __future__ import annotations

import pytest

from benchmarks.rewards import gsm8k_closeness


def test_closeness_of_the_last_number() -> None:
    assert gsm8k_closeness("openai/gsm8k", "she has 7 apples", "#### 7") == 1.0
    assert gsm8k_closeness("openai/gsm8k", "she has 5 apples", "10") == pytest.approx(2 / 3)
    assert gsm8k_closeness("openai/gsm8k", "3, then 1,234.", "1234") == 1.0  # the last number, commas dropped
    assert gsm8k_closeness("openai/gsm8k", "no number here", "10") == 0.0
