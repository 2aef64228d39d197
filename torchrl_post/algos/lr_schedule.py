"""Learning-rate schedules: the factor on the configured lr at each update, constant or cosine after a linear warmup.

verl's keys and meaning (`lr_scheduler_type`, formerly `warmup_style`; `lr_warmup_steps`, `lr_warmup_steps_ratio`,
`min_lr_ratio`, `num_cycles`). An update is a training step (one scheduler step, however many mini-batches it
steps the optimizer for). With k the 0-based update index (LambdaLR's `last_epoch`), s = k + 1 the update's number,
W warmup updates, T the run's total updates, m = min_lr_ratio and c = num_cycles:

    constant:  min(1, s / W)                                        (1 when W = 0)
    cosine:    m + (1 - m) * s / W                                  while s < W
               max(m, m + (1 - m) * (1 + cos(2 pi c p)) / 2)        after, p = min(1, (s - W) / max(1, T - W))

Updates are counted from 1 (verl's `zero_indexed_step=false`): the first update already moves the weights (lr / W
during warmup, not 0) and the last one (s = T) trains at the floor m * lr. c = 0.5 is one half wave from lr down to
the floor; a run stepped past T stays on the floor.
"""

from __future__ import annotations

import math
from typing import get_args

from torchrl_post.config.enums import LrSchedulerType

LR_SCHEDULER_TYPES = get_args(LrSchedulerType)


def warmup_updates(lr_warmup_steps: int, lr_warmup_steps_ratio: float, total: int) -> int:
    """W: lr_warmup_steps when > 0, else int(lr_warmup_steps_ratio * total) (verl's rule; its -1 default works).

    >>> warmup_updates(5, 0.5, 100), warmup_updates(0, 0.1, 25), warmup_updates(-1, 0.0, 25)
    (5, 2, 0)
    """
    return lr_warmup_steps if lr_warmup_steps > 0 else int(lr_warmup_steps_ratio * total)


def lr_factor(
    step: int, warmup: int, total: int, style: str = "constant", min_ratio: float = 0.0, num_cycles: float = 0.5
) -> float:
    """The lr of update `step` (0-based) as a fraction of the configured lr (the module docstring's formulas).

    >>> lr_factor(0, 4, 10), lr_factor(9, 0, 10, "cosine", 0.1)
    (0.25, 0.1)
    """
    s = step + 1
    if style == "constant":
        return min(1.0, s / warmup) if warmup > 0 else 1.0
    if style != "cosine":
        raise ValueError(f"lr schedule {style!r} is not one of {', '.join(LR_SCHEDULER_TYPES)}")
    if s < warmup:
        return min_ratio + (1.0 - min_ratio) * s / warmup
    progress = min(1.0, (s - warmup) / max(1, total - warmup))
    wave = 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))
    return max(min_ratio, min_ratio + (1.0 - min_ratio) * wave)
