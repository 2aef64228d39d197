"""A GSM8K reward that is not constant within a group, for timing an update that has gradients to compute.

The exact-answer reward (`gsm8k`) is 0 for every sample of a 135M model at 64 tokens, so every group is uniform,
every advantage 0 and `actor.skip_zero_advantage` skips the whole update: a step timed so measures no training.
`gsm8k_closeness` scores the response's last number by its distance to the answer, 1 / (1 + |got - want| /
max(1, |want|)), and 0 without a number. Both sides of benchmarks/e2e.py load this file (TRL's by path).

>>> gsm8k_closeness("openai/gsm8k", "she has 7 apples", "#### 7")
1.0
>>> gsm8k_closeness("openai/gsm8k", "she has 5 apples", "10")
0.6666666666666666
"""

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
