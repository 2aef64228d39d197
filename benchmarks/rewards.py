"""A GSM8K reward that is not constant within a group (the exact answer is 0 for a whole group of a 135M model, so
`actor.skip_zero_advantage` would skip every update timed); both sides of benchmarks/e2e.py load it (TRL by path)."""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def _last_number(text: str) -> float | None:
    for found in reversed(_NUMBER.findall(text)):
        try:
            return float(found.replace(",", "").rstrip("."))
        except ValueError:
            continue
    return None


def gsm8k_closeness(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1 / (1 + relative distance) between the response's last number and the answer's; 0 without a number."""
    got, want = _last_number(solution_str), _last_number(str(ground_truth))
    if got is None or want is None:
        return 0.0
    return 1.0 / (1.0 + abs(got - want) / max(1.0, abs(want)))
