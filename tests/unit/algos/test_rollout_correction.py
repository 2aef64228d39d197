"""Tests of torchrl_post/algos/rollout_correction.py: importance weights, rejection masks, the veto and the
rollout_corr/* metrics, each against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from torchrl_post.algos.rollout_correction import (
    STAT_MAXES,
    STAT_SUMS,
    Corrected,
    RolloutCorrection,
    correct,
    correction_metrics,
    rs_band,
)

LN = math.log
# Rollout logprobs 0, so old - rollout is the log-ratio. Row 0: token ratios 2, 0.5, 4 and one padding token;
# row 1: one token of ratio 0.25; row 2: empty. Sequence ratios 4 and 0.25; geometric means 4^(1/3) and 0.25.
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
OLD = torch.tensor([[LN(2), LN(0.5), LN(4), -7.0], [LN(0.25), 3.0, 0.0, 0.0], [5.0, -5.0, 0.0, 1.0]])
ROLLOUT = torch.zeros(3, 4)


def _run(**kw: object) -> tuple[Corrected, dict[str, float]]:
    c = RolloutCorrection(**kw)  # type: ignore[arg-type]
    out = correct(OLD, ROLLOUT, MASK, c)
    return out, correction_metrics(_totals(out), c)


def _totals(out: Corrected) -> dict[str, float]:
    return dict(zip(STAT_SUMS, out.sums.tolist(), strict=True)) | dict(zip(STAT_MAXES, out.maxes.tolist(), strict=True))


def _valid(x: torch.Tensor) -> list[list[float]]:
    """The values on MASK's tokens, row by row."""
    return [
        [v for v, m in zip(row, mrow, strict=True) if m] for row, mrow in zip(x.tolist(), MASK.tolist(), strict=True)
    ]


# --- importance weights -------------------------------------------------------------------------------------------


def test_token_truncated_is_by_hand() -> None:
    out, metrics = _run(rollout_is="token", rollout_is_threshold=2.0)
    assert out.keep_bt is None
    assert out.weights_bt is not None
    assert _valid(out.weights_bt) == [pytest.approx([2.0, 0.5, 2.0]), pytest.approx([0.25]), []]
    # ratios 2, 0.5, 4, 0.25: mean 6.75 / 4, E[r^2] = 20.3125 / 4
    mean = 6.75 / 4
    assert metrics == pytest.approx(
        {
            "rollout_corr/is_weight_mean": 4.75 / 4,
            "rollout_corr/is_clipfrac": 2 / 4,  # 2 and 4 reach the cap
            "rollout_corr/rollout_is_mean": mean,
            "rollout_corr/rollout_is_std": math.sqrt(20.3125 / 4 - mean**2),
            "rollout_corr/rollout_is_max": 4.0,
            "rollout_corr/rollout_is_min": 0.25,
        }
    )


def test_token_level_is_todays_truncated_is_weights() -> None:
    gen = torch.Generator().manual_seed(0)
    old, rollout = -3 * torch.rand(4, 9, generator=gen), -3 * torch.rand(4, 9, generator=gen)
    mask = (torch.rand(4, 9, generator=gen) > 0.3).float()
    out = correct(old, rollout, mask, RolloutCorrection(rollout_is="token", rollout_is_threshold=1.5))
    todays = torch.exp(old - rollout).clamp(max=1.5)  # truncated_is_weights before this module
    assert out.weights_bt is not None
    assert torch.equal(out.weights_bt[mask > 0], todays[mask > 0])


def test_token_weights_hand_computed_probabilities() -> None:
    old = torch.tensor([[LN(0.5), LN(0.9), LN(0.2)]], requires_grad=True)
    rollout = torch.tensor([[LN(0.25), LN(0.9), LN(0.8)]])
    out = correct(old, rollout, torch.ones(1, 3), RolloutCorrection(rollout_is="token", rollout_is_threshold=1.5))
    assert out.weights_bt is not None
    assert out.weights_bt.tolist()[0] == pytest.approx([1.5, 1.0, 0.25])  # 2.0 capped at 1.5; equal; 0.2/0.8
    assert not out.weights_bt.requires_grad


def test_sequence_truncated_is_by_hand() -> None:
    out, metrics = _run(rollout_is="sequence", rollout_is_threshold=2.0)
    assert out.weights_bt is not None
    assert _valid(out.weights_bt) == [pytest.approx([2.0, 2.0, 2.0]), pytest.approx([0.25]), []]  # min(4, 2), 0.25
    mean = (3 * 4 + 0.25) / 4  # each row's ratio once per token
    assert metrics == pytest.approx(
        {
            "rollout_corr/is_weight_mean": (3 * 2 + 0.25) / 4,
            "rollout_corr/is_clipfrac": 3 / 4,
            "rollout_corr/rollout_is_mean": mean,
            "rollout_corr/rollout_is_std": math.sqrt((3 * 16 + 0.0625) / 4 - mean**2),
            "rollout_corr/rollout_is_max": 4.0,
            "rollout_corr/rollout_is_min": 0.25,
        }
    )


# --- rejection and veto ------------------------------------------------------------------------------------------


def test_token_rejection_by_hand() -> None:
    out, metrics = _run(rollout_rs="token", rollout_rs_threshold=3.0, rollout_rs_threshold_lower=0.4)
    assert out.weights_bt is None and out.keep_bt is not None
    assert _valid(out.keep_bt) == [[1.0, 1.0, 0.0], [0.0], []]  # 4 > 3, 0.25 < 0.4
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 4)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 2)  # the empty row is no row
    assert metrics["rollout_corr/rollout_rs_mean"] == pytest.approx(6.75 / 4)
    assert (metrics["rollout_corr/rollout_rs_max"], metrics["rollout_corr/rollout_rs_min"]) == pytest.approx((4, 0.25))
    assert "rollout_corr/rollout_is_mean" not in metrics and "rollout_corr/rollout_is_veto_fraction" not in metrics


def test_sequence_rejection_by_hand() -> None:
    out, metrics = _run(rollout_rs="sequence", rollout_rs_threshold=3.0, rollout_rs_threshold_lower=0.2)
    assert out.keep_bt is not None
    assert _valid(out.keep_bt) == [[0.0, 0.0, 0.0], [1.0], []]  # the product 4 > 3 drops all of row 0
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 4)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    assert metrics["rollout_corr/rollout_rs_mean"] == pytest.approx(12.25 / 4)


def test_geometric_rejection_by_hand() -> None:
    # g = 4^(1/3) = 1.587 for row 0 (kept by a band that drops its sequence ratio 4), 0.25 for row 1
    out, metrics = _run(rollout_rs="geometric", rollout_rs_threshold=3.0, rollout_rs_threshold_lower=0.3)
    assert out.keep_bt is not None
    assert _valid(out.keep_bt) == [[1.0, 1.0, 1.0], [0.0], []]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 4)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    g = 4 ** (1 / 3)
    assert metrics["rollout_corr/rollout_rs_mean"] == pytest.approx((3 * g + 0.25) / 4)
    assert metrics["rollout_corr/rollout_rs_max"] == pytest.approx(g)


def test_veto_drops_rows_with_a_catastrophic_token() -> None:
    out, metrics = _run(rollout_token_veto_threshold=0.3)  # row 1's 0.25 < 0.3; row 0's 0.5 is not
    assert out.weights_bt is None and out.keep_bt is not None
    assert _valid(out.keep_bt) == [[1.0, 1.0, 1.0], [0.0], []]
    assert metrics == pytest.approx({"rollout_corr/rollout_is_veto_fraction": 1 / 2})


def test_rejection_veto_and_weights_together() -> None:
    kw = dict(rollout_is="token", rollout_rs="token", rollout_rs_threshold=3.0, rollout_token_veto_threshold=0.3)
    out, metrics = _run(**kw)
    assert out.keep_bt is not None and out.weights_bt is not None
    assert _valid(out.keep_bt) == [[1.0, 1.0, 0.0], [0.0], []]  # band [1/3, 3]: 4 rejected; row 1 vetoed (and out)
    assert _valid(out.weights_bt)[0] == pytest.approx([2.0, 0.5, 2.0])  # the weights are the cap's, not the band's
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 4)
    assert metrics["rollout_corr/rollout_is_veto_fraction"] == pytest.approx(1 / 2)


# --- what never counts, and what never overflows ------------------------------------------------------------------


def test_masked_out_tokens_never_count() -> None:
    c = RolloutCorrection(rollout_is="sequence", rollout_rs="geometric", rollout_rs_threshold=3.0)
    junk = torch.where(MASK > 0, OLD, torch.tensor([[math.inf, -math.inf, math.nan, 1e6]]).expand(3, 4))
    a, b = correct(OLD, ROLLOUT, MASK, c), correct(junk, ROLLOUT, MASK, c)
    assert torch.equal(a.sums, b.sums) and torch.equal(a.maxes, b.maxes)
    assert a.keep_bt is not None and b.keep_bt is not None and a.weights_bt is not None and b.weights_bt is not None
    assert torch.equal(a.keep_bt * MASK, b.keep_bt * MASK)
    assert torch.equal(a.weights_bt * MASK, b.weights_bt * MASK)
    assert torch.isfinite(b.weights_bt).all()


def test_empty_rows_give_zero_metrics() -> None:
    c = RolloutCorrection(rollout_is="token", rollout_rs="sequence", rollout_token_veto_threshold=1e-4)
    out = correct(OLD, ROLLOUT, torch.zeros(3, 4), c)
    assert out.sums.tolist() == [0.0] * len(STAT_SUMS)
    assert out.maxes.tolist() == [-math.inf] * len(STAT_MAXES)  # the neutral element of the max over ranks
    assert set(correction_metrics(_totals(out), c).values()) == {0.0}


def test_extreme_ratios_stay_finite() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0], [-80.0, -80.0, 0.0]])
    rollout = torch.tensor([[-60.0, -60.0, -1e4], [0.0, 0.0, 0.0]])  # log-ratios +60, +60, +1e4; -80, -80
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    for level in ("token", "sequence"):
        c = RolloutCorrection(rollout_is=level, rollout_rs="geometric", rollout_token_veto_threshold=1e-4)
        out = correct(old, rollout, mask, c)
        assert out.weights_bt is not None and out.keep_bt is not None
        assert torch.isfinite(out.weights_bt).all() and torch.isfinite(out.sums).all()
        assert out.weights_bt[0].tolist() == [2.0, 2.0, 2.0]  # capped
        assert out.keep_bt.tolist() == [[0.0] * 3, [0.0] * 3]  # outside [0.5, 2]; row 1 also vetoed
        metrics = correction_metrics(_totals(out), c)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(math.exp(20.0))  # verl's bound
        assert metrics["rollout_corr/rollout_rs_min"] == pytest.approx(math.exp(-80.0))


def test_parts_sum_to_the_whole() -> None:
    """The actor adds the sums of its micro-batches (and ranks) and maxes their maxes."""
    c = RolloutCorrection(rollout_is="token", rollout_rs="sequence", rollout_rs_threshold=3.0)
    whole = correct(OLD, ROLLOUT, MASK, c)
    parts = [correct(OLD[rows], ROLLOUT[rows], MASK[rows], c) for rows in (slice(0, 1), slice(1, 3))]
    torch.testing.assert_close(parts[0].sums + parts[1].sums, whole.sums)
    torch.testing.assert_close(torch.maximum(parts[0].maxes, parts[1].maxes), whole.maxes)


def test_off_corrects_nothing() -> None:
    c = RolloutCorrection()
    assert not c.active and not c.rejects and c.describe() == "off"
    out = correct(OLD, ROLLOUT, MASK, c)
    assert out.weights_bt is None and out.keep_bt is None
    assert correction_metrics(_totals(out), c) == {}


def test_rs_band_defaults_as_verl() -> None:
    assert rs_band(None, None, 2.0) == (0.5, 2.0)  # the upper end is rollout_is_threshold, the lower 1 / upper
    assert rs_band(1.001, None, 2.0) == (1 / 1.001, 1.001)
    assert rs_band(3.0, 0.1, 2.0) == (0.1, 3.0)


def test_describe() -> None:
    c = RolloutCorrection("sequence", 5.0, "geometric", 1.001, 0.999, 1e-4)
    assert c.describe() == (
        "sequence-level truncated IS, cap 5; geometric rejection outside [0.999, 1.001]; "
        "veto of rows with a token ratio below 0.0001"
    )
