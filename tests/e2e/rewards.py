"""Reward functions for end-to-end tests on untrained models (verl signature)."""

from __future__ import annotations

from typing import Any


def digit_fraction(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """Share of the response's characters that are digits: varies even for a random model, so GRPO has signal."""
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)


def has_digit(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1 if the response holds a digit: a binary reward, so some groups of a random model are uniform."""
    return float(any(c.isdigit() for c in solution_str))
