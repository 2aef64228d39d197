"""Tests of torchrl_post/algos/lr_schedule.py against hand-computed factors."""

from __future__ import annotations

import math

import pytest

from torchrl_post.algos.lr_schedule import lr_factor, warmup_updates

COS_QUARTER = 0.5 * (1 + math.cos(math.pi / 4))  # 0.853553...: a quarter of the half wave done


def test_warmup_updates_follow_verl() -> None:
    assert warmup_updates(5, 0.5, 100) == 5  # the step count wins when > 0
    assert warmup_updates(0, 0.1, 25) == 2  # int(2.5): truncated as verl
    assert warmup_updates(-1, 0.03, 100) == 3  # verl's default -1 hands over to the ratio too
    assert warmup_updates(0, 0.0, 100) == 0


def test_constant_ramps_linearly_then_holds() -> None:
    assert [lr_factor(k, 4, 10) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_factor(k, 0, 10) for k in range(3)] == [1.0, 1.0, 1.0]
    assert lr_factor(0, 4, 10, min_ratio=0.5) == 0.25  # the floor shapes the cosine only


def test_cosine_half_wave_to_zero() -> None:
    got = [lr_factor(k, 0, 4, "cosine") for k in range(4)]  # updates 1..4 of 4, no warmup
    assert got == pytest.approx([COS_QUARTER, 0.5, 1 - COS_QUARTER, 0.0])


def test_cosine_warmup_midpoint_and_floor() -> None:
    # W = 2, T = 10, floor 0.1: update 1 ramps from the floor, update 2 is the peak, update 6 the mid-point of the
    # 8 decay updates, update 10 the floor; past the total it stays there.
    f = [lr_factor(k, 2, 10, "cosine", 0.1) for k in range(12)]
    assert f[0] == pytest.approx(0.1 + 0.9 * 0.5)
    assert f[1] == pytest.approx(1.0)
    assert f[5] == pytest.approx(0.1 + 0.9 * 0.5)
    assert f[9] == pytest.approx(0.1)
    assert f[10] == f[11] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[1:10], f[2:10], strict=False))  # decays monotonically


def test_cosine_full_cycle_returns_to_peak() -> None:
    got = [lr_factor(k, 0, 4, "cosine", 0.0, num_cycles=1.0) for k in range(4)]
    assert got == pytest.approx([0.5, 0.0, 0.5, 1.0])


def test_unknown_style_raises() -> None:
    with pytest.raises(ValueError, match="linear"):
        lr_factor(0, 0, 10, "linear")
