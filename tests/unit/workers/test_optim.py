"""Tests of torchrl_post/workers/optim.py's lr schedule: the LambdaLR a role builds, and its exact resume."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from torchrl_post.algos.lr_schedule import lr_factor
from torchrl_post.config.schema import ActorConfig, CriticConfig
from torchrl_post.workers.optim import build_optimizer, load_scheduler, lr_schedule

LR, TOTAL = 0.1, 10


def _role(cfg: ActorConfig | CriticConfig, total: int = TOTAL) -> tuple[Any, Any]:
    model = torch.nn.Linear(2, 1)
    return build_optimizer(model, cfg.lr, cfg.weight_decay, lr_schedule(cfg, total))


def _updates(optimizer: Any, scheduler: Any, n: int) -> list[float]:
    """n training steps as the actor takes them (optimizer steps, then one scheduler step); the lr of each."""
    lrs = []
    for _ in range(n):
        lrs.append(optimizer.param_groups[0]["lr"])
        params = optimizer.param_groups[0]["params"]
        loss = sum(p.sum() for p in params)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return lrs


def test_role_schedule_is_the_pure_function() -> None:
    cfg = ActorConfig(lr=LR, lr_scheduler_type="cosine", lr_warmup_steps_ratio=0.2, min_lr_ratio=0.1)
    optimizer, scheduler = _role(cfg)
    lrs = _updates(optimizer, scheduler, TOTAL)
    assert lrs == [LR * lr_factor(k, 2, TOTAL, "cosine", 0.1) for k in range(TOTAL)]  # W = int(0.2 x 10)
    assert lrs[-1] == pytest.approx(LR * 0.1)  # the last update trains at the floor
    constant = _updates(*_role(CriticConfig(lr=LR, lr_warmup_steps=4)), 5)
    assert constant == pytest.approx([LR * f for f in (0.25, 0.5, 0.75, 1.0, 1.0)])


def test_scheduler_resumes_mid_cosine_with_identical_lrs() -> None:
    cfg = ActorConfig(lr=LR, lr_scheduler_type="cosine", lr_warmup_steps=2, min_lr_ratio=0.1)
    optimizer, scheduler = _role(cfg)
    first = _updates(optimizer, scheduler, 5)
    state = copy.deepcopy(scheduler.state_dict())
    rest = _updates(optimizer, scheduler, TOTAL - 5)
    assert state["last_epoch"] == 5 and state["lr_lambdas"] == [None]  # a position, no schedule keys

    # A fresh process: the optimizer as built (its own checkpoint not loaded), the scheduler's state loaded.
    optimizer2, scheduler2 = _role(cfg)
    load_scheduler(scheduler2, state)
    assert _updates(optimizer2, scheduler2, TOTAL - 5) == rest
    assert first + rest == [LR * lr_factor(k, 2, TOTAL, "cosine", 0.1) for k in range(TOTAL)]


def test_resume_follows_this_runs_lr_and_total() -> None:
    cfg = ActorConfig(lr=LR, lr_scheduler_type="cosine")
    optimizer, scheduler = _role(cfg)
    _updates(optimizer, scheduler, 5)
    longer = ActorConfig(lr=2 * LR, lr_scheduler_type="cosine")
    optimizer2, scheduler2 = _role(longer, total=20)
    load_scheduler(scheduler2, scheduler.state_dict())
    assert optimizer2.param_groups[0]["lr"] == 2 * LR * lr_factor(5, 0, 20, "cosine")
