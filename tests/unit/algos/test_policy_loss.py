"""Tests of torchrl_post/algos/policy_loss.py: PPO clip (dual clip), GSPO, Clip-Cov, KL-Cov and loss aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.algos.helpers import MASK
from tests.unit.loss_helpers import RESP_LENS, L, N, R, _case
from torchrl_post.algos.policy_loss import (
    LOSS_AGG_MODES,
    LossScale,
    agg_loss,
    clip_cov_loss,
    covariance_bt,
    gspo_loss,
    kl_cov_loss,
    masked_mean,
    policy_loss,
    ppo_clip_loss,
    selection_generator,
)
from torchrl_post.config.schema import ActorConfig
from torchrl_post.workers.micro_batches import micro_slices

# --- ppo_clip_loss ------------------------------------------------------------------------------------------


def _ppo_by_hand(logp: float, old: float, a: float, low: float, high: float) -> tuple[float, float, bool]:
    r = math.exp(logp - old)
    unclipped = -a * r
    clipped = -a * min(max(r, 1 - low), 1 + high)
    return r, max(unclipped, clipped), clipped > unclipped


def test_ppo_clip_loss_by_hand():
    # ratios: 1.1 (inside), 1.5 (above 1.2), 0.5 (below 0.8); each with A = +2 and A = -2
    ratios = [1.1, 1.5, 0.5, 1.1, 1.5, 0.5]
    advs = [2.0, 2.0, 2.0, -2.0, -2.0, -2.0]
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5]])
    logp = old + torch.log(torch.tensor(ratios)).view(2, 3)
    adv = torch.tensor(advs).view(2, 3)
    out = ppo_clip_loss(logp, old, adv, 0.2, 0.2)

    torch.testing.assert_close(out.ratio_bt, torch.tensor(ratios).view(2, 3))
    # Worked out: -A*r vs -A*clip(r, 0.8, 1.2), the larger one.
    expected_loss = torch.tensor(
        [
            [-2.2, -2.4, -1.0],  # A>0: inside -> -2*1.1; above -> clipped -2*1.2; below -> unclipped -2*0.5
            [2.2, 3.0, 1.6],  # A<0: inside -> 2*1.1; above -> unclipped 2*1.5; below -> clipped 2*0.8
        ]
    )
    torch.testing.assert_close(out.loss_bt, expected_loss)
    expected_clipped = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(out.clipped_bt, expected_clipped)
    torch.testing.assert_close(out.approx_kl_bt, old - logp)

    for i, (r, a) in enumerate(zip(ratios, advs, strict=True)):
        _, loss, clipped = _ppo_by_hand(math.log(r), 0.0, a, 0.2, 0.2)
        assert out.loss_bt.flatten()[i].item() == pytest.approx(loss, rel=1e-5)
        assert bool(out.clipped_bt.flatten()[i]) is clipped


def test_ppo_clip_loss_asymmetric_range():
    # low=0.1 (ratio >= 0.9), high=0.3 (ratio <= 1.3)
    ratios = torch.tensor([[1.25, 1.4, 0.85, 0.95]])
    adv_pos = torch.ones(1, 4)
    out = ppo_clip_loss(torch.log(ratios), torch.zeros(1, 4), adv_pos, 0.1, 0.3)
    # A=+1: 1.25 inside (high is 0.3, so not clipped at 1.2), 1.4 clipped to 1.3
    torch.testing.assert_close(out.loss_bt, torch.tensor([[-1.25, -1.3, -0.85, -0.95]]))
    torch.testing.assert_close(out.clipped_bt, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))

    out = ppo_clip_loss(torch.log(ratios), torch.zeros(1, 4), -adv_pos, 0.1, 0.3)
    # A=-1: 0.85 clipped up to 0.9 (low is 0.1), 0.95 inside
    torch.testing.assert_close(out.loss_bt, torch.tensor([[1.25, 1.4, 0.9, 0.95]]))
    torch.testing.assert_close(out.clipped_bt, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))


def test_ppo_clip_loss_on_policy_is_minus_advantage():
    logp = torch.tensor([[-0.3, -1.7]])
    adv = torch.tensor([[0.7, -1.2]])
    out = ppo_clip_loss(logp, logp.clone(), adv, 0.2, 0.28)
    torch.testing.assert_close(out.ratio_bt, torch.ones(1, 2))
    torch.testing.assert_close(out.loss_bt, -adv)
    assert out.clipped_bt.sum() == 0


def test_ppo_clip_loss_gradient_is_zero_when_clipped():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)
    out = ppo_clip_loss(logp, old, torch.ones(1, 2), 0.2, 0.2)
    out.loss_bt.sum().backward()
    # clipped token: no gradient; inside token: d(-r)/dlogp = -r
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.1]]))


# --- ppo_clip_loss dual clip --------------------------------------------------------------------------------


def test_dual_clip_by_hand():
    ratios = torch.tensor([[10.0, 1.1, 10.0, 0.5, 3.5]])
    adv = torch.tensor([[-1.0, -1.0, 1.0, -2.0, -2.0]])
    logp = torch.log(ratios).requires_grad_(True)
    out = ppo_clip_loss(logp, torch.zeros(1, 5), adv, 0.2, 0.2, clip_c=3.0)
    # standard losses: 10, 1.1, -1.2 (A>0, clipped at 1.2), 1.6 (A<0, clipped at 0.8), 7
    # dual bound -A*3 for A<0: 3, 3, -, 6, 6 -> taken where the standard loss exceeds it
    torch.testing.assert_close(out.loss_bt, torch.tensor([[3.0, 1.1, -1.2, 1.6, 6.0]]))
    torch.testing.assert_close(out.dual_clipped_bt, torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0]]))
    torch.testing.assert_close(out.clipped_bt, torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]]))
    out.loss_bt.sum().backward()
    # dual-clipped tokens are constants (no gradient); token 1 unclipped: d(-A r)/dlogp = 1.1
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 1.1, 0.0, 0.0, 0.0]]))


def test_dual_clip_off_by_default():
    logp = torch.log(torch.tensor([[10.0, 1.1]]))
    adv = torch.tensor([[-1.0, 1.0]])
    out = ppo_clip_loss(logp, torch.zeros(1, 2), adv, 0.2, 0.2)
    torch.testing.assert_close(out.loss_bt, torch.tensor([[10.0, -1.1]]))
    assert torch.all(out.dual_clipped_bt == 0) and out.dual_clipped_bt.shape == (1, 2)


def test_dual_clip_positive_advantages_unaffected():
    torch.manual_seed(5)
    logp = torch.randn(3, 4)
    old = torch.randn(3, 4)
    adv = torch.rand(3, 4) + 0.1
    plain = ppo_clip_loss(logp, old, adv, 0.2, 0.28)
    dual = ppo_clip_loss(logp, old, adv, 0.2, 0.28, clip_c=1.5)
    torch.testing.assert_close(dual.loss_bt, plain.loss_bt)
    assert torch.all(dual.dual_clipped_bt == 0)


@pytest.mark.parametrize("clip_c", [1.0, 0.5])
def test_dual_clip_rejects_c_not_above_one(clip_c: float):
    with pytest.raises(ValueError, match="clip_c"):
        ppo_clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 0.2, 0.2, clip_c=clip_c)


# --- gspo_loss ----------------------------------------------------------------------------------------------

GSPO_OLD = torch.tensor([[-1.0, -2.0, -0.5, -1.0], [-0.7, -1.0, -1.0, -1.0]])
# log ratios: row 0 [0.1, -0.3, 0.5, 7 (masked)] -> mean 0.1; row 1 [0.2, 5, 5, 5 (masked)] -> mean 0.2
GSPO_LOGP = GSPO_OLD + torch.tensor([[0.1, -0.3, 0.5, 7.0], [0.2, 5.0, 5.0, 5.0]])


def test_gspo_ratio_is_sequence_level():
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-2.0, -2.0, -2.0, -2.0]])
    out = gspo_loss(GSPO_LOGP, GSPO_OLD, adv, MASK, 0.5, 0.5)
    s = torch.tensor([math.exp(0.1), math.exp(0.2)])
    torch.testing.assert_close(out.ratio_bt, s[:, None].expand(2, 4))
    torch.testing.assert_close(out.loss_bt, -adv * s[:, None])  # inside [0.5, 1.5]: unclipped
    assert out.clipped_bt.sum() == 0 and torch.all(out.dual_clipped_bt == 0)
    torch.testing.assert_close(out.approx_kl_bt, GSPO_OLD - GSPO_LOGP)


def test_gspo_small_clip_range():
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-2.0, -2.0, -2.0, -2.0]])
    out = gspo_loss(GSPO_LOGP, GSPO_OLD, adv, MASK, 3e-4, 4e-4)
    # row 0: A>0, s = e^0.1 > 1.0004 -> clipped to 1.0004; row 1: A<0, s = e^0.2 -> the unclipped -A s is larger
    torch.testing.assert_close(out.loss_bt[0], torch.full((4,), -1.0004))
    torch.testing.assert_close(out.loss_bt[1], torch.full((4,), 2.0 * math.exp(0.2)))
    torch.testing.assert_close(out.clipped_bt, torch.tensor([[1.0] * 4, [0.0] * 4]))


def test_gspo_gradient_is_per_token():
    adv = torch.tensor([[1.0, -0.5, 2.0, 1.0], [-2.0, -2.0, -2.0, -2.0]])
    logp = GSPO_LOGP.clone().requires_grad_(True)
    out = gspo_loss(logp, GSPO_OLD, adv, MASK, 0.5, 0.5)
    (out.loss_bt * MASK).sum().backward()
    s = torch.tensor([math.exp(0.1), math.exp(0.2)])
    # d(-A s_b exp(logp - sg[logp]))/dlogp_t = -A_t s_b on each real token, nothing leaks through s_b
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, -adv * s[:, None] * MASK)

    # one token's loss only moves its own logp
    logp2 = GSPO_LOGP.clone().requires_grad_(True)
    gspo_loss(logp2, GSPO_OLD, adv, MASK, 0.5, 0.5).loss_bt[0, 1].backward()
    assert logp2.grad is not None
    expected = torch.zeros(2, 4)
    expected[0, 1] = 0.5 * math.exp(0.1)
    torch.testing.assert_close(logp2.grad, expected)


# --- agg_loss / masked_mean ---------------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])


def test_agg_loss_token_mean():
    # masked tokens: 1, 2, 3, 5 -> sum 11 over 4 tokens
    assert agg_loss(LOSS, MASK, "token-mean").item() == pytest.approx(11 / 4)


def test_agg_loss_token_mean_with_global_count():
    # 10 tokens in the whole mini-batch, 2 ranks whose gradients FSDP averages: this share is 11 / (10 / 2)
    assert agg_loss(LOSS, MASK, "token-mean", LossScale(10, 4, 4, 2)).item() == pytest.approx(11 / 5)


def test_agg_loss_seq_mean_token_sum():
    # per-sequence sums 6 and 5 -> mean 5.5
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(5.5)


def test_agg_loss_seq_mean_token_mean():
    # per-sequence means 6/3 = 2 and 5/1 = 5 -> mean 3.5
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(3.5)


def test_agg_loss_seq_mean_token_sum_norm():
    # total 11 / (2 sequences x max_response_length): the constant, not the padded width
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", LossScale(4, 2, 4)).item() == pytest.approx(11 / 8)
    wide = torch.cat([LOSS, torch.full((2, 4), 100.0)], dim=1)
    wide_mask = torch.cat([MASK, torch.zeros(2, 4)], dim=1)
    assert agg_loss(wide, wide_mask, "seq-mean-token-sum-norm", LossScale(4, 2, 4)).item() == pytest.approx(11 / 8)


def test_agg_loss_ignores_masked_values():
    poisoned = LOSS.masked_fill(MASK == 0, 1e6)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert agg_loss(poisoned, MASK, mode).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item())


def test_agg_loss_empty_row_is_not_counted():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # the empty (filtered) row leaves the denominator: seq mean 2 over one sequence
    assert agg_loss(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert agg_loss(LOSS, torch.zeros(2, 4), "token-mean").item() == 0.0


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match="bogus"):
        agg_loss(LOSS, MASK, "bogus")


def test_masked_mean():
    assert masked_mean(LOSS, MASK).item() == pytest.approx(11 / 4)
    assert masked_mean(torch.tensor([2.0, 4.0, 100.0]), torch.tensor([1.0, 1.0, 0.0])).item() == pytest.approx(3.0)
    assert masked_mean(LOSS, torch.zeros(2, 4)).item() == 0.0


# --- agg_loss over micro-batches and ranks -------------------------------------------------------------------
#
# The contract of `agg_loss` with a mini-batch `LossScale` (tokens and valid rows of the whole mini-batch, the
# constant max_response_length, dp_size): the sum of the micro-batches' shares equals one call on the whole
# mini-batch, in value and in gradient, for every mode and every split (equal, uneven, token-budget micro-batches
# from `micro_slices`). Also: each mode's value by hand, the Dr.GRPO constant not depending on the padded width,
# all-zero (filtered) rows leaving every denominator, and two data-parallel ranks averaging to the single-rank value.


def _mini_scale(mask: torch.Tensor, dp_size: int = 1) -> LossScale:
    """The scale the contract defines: tokens and non-empty rows of the whole mini-batch, the constant L."""
    return LossScale(float(mask.sum()), float((mask.sum(-1) > 0).sum()), L, dp_size)


def _value_and_grad(logp, adv, mask, mode, scale, splits):
    """Sum of agg_loss over the micro-batches `splits` (row slices or index tensors), and d/d logp of it."""
    total = sum(agg_loss((logp * adv)[s], mask[s], mode, scale) for s in splits)
    (grad,) = torch.autograd.grad(total, logp)
    return total.detach(), grad


def _sizes_to_slices(sizes: list[int]) -> list[slice]:
    out, start = [], 0
    for k in sizes:
        out.append(slice(start, start + k))
        start += k
    assert start == N
    return out


def _whole(logp, adv, mask, mode, scale):
    return _value_and_grad(logp, adv, mask, mode, scale, [slice(0, N)])


# ------------------------------------------------------------------------------------- micro-batch invariance


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("sizes", [[4, 4, 4], [8, 4], [1, 11], [5, 5, 2], [1] * N], ids=lambda s: "-".join(map(str, s)))
def test_micro_batch_sum_equals_whole(mode, sizes):
    logp, adv, mask, _ = _case()
    scale = _mini_scale(mask)
    whole_v, whole_g = _whole(logp, adv, mask, mode, scale)
    v, g = _value_and_grad(logp, adv, mask, mode, scale, _sizes_to_slices(sizes))
    torch.testing.assert_close(v, whole_v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, whole_g, rtol=1e-12, atol=1e-12)
    # and the whole-batch value with the mini-batch scale is the mode's definition
    torch.testing.assert_close(whole_v, _reference(logp.detach() * adv, mask, mode), rtol=1e-12, atol=1e-12)
    assert g[mask == 0].eq(0).all()  # no gradient through padding or the filtered row
    assert g[mask == 1].ne(0).any()


def _reference(l_bt: torch.Tensor, m_bt: torch.Tensor, mode: str) -> torch.Tensor:
    """The modes' definitions, written row by row (valid rows only for the seq modes)."""
    rows = [(l_bt[b], m_bt[b]) for b in range(len(l_bt)) if m_bt[b].sum() > 0]
    tok_sum = sum((x * m).sum() for x, m in rows)
    if mode == "token-mean":
        return tok_sum / sum(m.sum() for _, m in rows)
    if mode == "seq-mean-token-sum":
        return tok_sum / len(rows)
    if mode == "seq-mean-token-mean":
        return sum((x * m).sum() / m.sum() for x, m in rows) / len(rows)
    assert mode == "seq-mean-token-sum-norm"
    return tok_sum / (len(rows) * L)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("budget", [24, 40, 70])
def test_token_budget_micro_batches_equal_whole(mode, budget):
    logp, adv, mask, attention = _case()
    slices = micro_slices(attention, R, max_rows=N, token_budget=budget)
    assert len(slices) > 1
    scale = _mini_scale(mask)
    whole_v, whole_g = _whole(logp, adv, mask, mode, scale)
    v, g = _value_and_grad(logp, adv, mask, mode, scale, slices)
    torch.testing.assert_close(v, whole_v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, whole_g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_share_without_global_scale_is_wrong(mode):
    """Sanity check of the case: per-micro-batch local denominators do not add up to the whole (so the invariance
    above is a property of the mini-batch scale, not of the data)."""
    logp, adv, mask, _ = _case()
    whole_v, _ = _whole(logp, adv, mask, mode, _mini_scale(mask))
    parts = _sizes_to_slices([1, 11])
    local = sum(agg_loss((logp * adv)[s], mask[s], mode, LossScale.local(mask[s], L)) for s in parts)
    assert not torch.allclose(local.detach(), whole_v)


# ------------------------------------------------------------------------------------------ hand-computed values

LOSS_2x4 = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=torch.float64)
MASK_2x4 = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
# masked sums: row 0 = 3 (2 tokens), row 1 = 18 (3 tokens); 21 over 5 tokens, 2 valid rows
HAND = {
    "token-mean": 21 / 5,
    "seq-mean-token-sum": (3 + 18) / 2,
    "seq-mean-token-mean": (3 / 2 + 18 / 3) / 2,
    "seq-mean-token-sum-norm": 21 / (2 * 6),  # with max_response_length 6
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_hand_computed_whole_batch(mode):
    scale = LossScale(tokens=5, seqs=2, max_response_length=6)
    assert agg_loss(LOSS_2x4, MASK_2x4, mode, scale).item() == pytest.approx(HAND[mode], rel=1e-12)
    assert agg_loss(LOSS_2x4, MASK_2x4, mode, LossScale.local(MASK_2x4, 6)).item() == pytest.approx(HAND[mode])
    # padding wider (more zero-mask columns, garbage losses there) changes nothing with the scale given
    wide_l = torch.cat([LOSS_2x4, torch.full((2, 5), 1e3, dtype=torch.float64)], dim=1)
    wide_m = torch.nn.functional.pad(MASK_2x4, (0, 5))
    assert agg_loss(wide_l, wide_m, mode, scale).item() == pytest.approx(HAND[mode], rel=1e-12)
    assert agg_loss(wide_l, wide_m, mode, LossScale.local(wide_m, 6)).item() == pytest.approx(HAND[mode])


def test_default_scale_is_the_mask_alone():
    """Without a scale: this mask's tokens and valid rows; Dr.GRPO's constant falls back to the tensor width."""
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert agg_loss(LOSS_2x4, MASK_2x4, mode).item() == pytest.approx(HAND[mode])
    assert agg_loss(LOSS_2x4, MASK_2x4, "seq-mean-token-sum-norm").item() == pytest.approx(21 / (2 * 4))
    s = LossScale.local(MASK_2x4)
    assert (s.tokens, s.seqs, s.max_response_length, s.dp_size) == (5.0, 2.0, 4, 1)


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(LOSS_2x4, MASK_2x4, "seq-mean", LossScale(5, 2, 6))


# ---------------------------------------------------------------------------------------------- filtered rows


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_zero_rows_leave_every_denominator(mode):
    huge = torch.full((1, 4), 1e6, dtype=torch.float64)
    zero = torch.zeros(1, 4, dtype=torch.float64)
    loss = torch.cat([LOSS_2x4[:1], huge, LOSS_2x4[1:], huge])
    mask = torch.cat([MASK_2x4[:1], zero, MASK_2x4[1:], zero])
    assert agg_loss(loss, mask, mode, LossScale.local(mask, 6)).item() == pytest.approx(HAND[mode], rel=1e-12)
    s = LossScale.local(mask, 6)
    assert (s.tokens, s.seqs) == (5.0, 2.0)
    if mode != "seq-mean-token-sum-norm":  # the scale-less default (width 4 = L here too) agrees
        assert agg_loss(loss, mask, mode).item() == pytest.approx(HAND[mode], rel=1e-12)
    # and in the 12-row case: the filtered row is not counted, its gradient is zero
    logp, adv, m12, _ = _case()
    assert _mini_scale(m12).seqs == N - 1
    v, g = _whole(logp, adv, m12, mode, _mini_scale(m12))
    keep = torch.tensor([i for i in range(N) if RESP_LENS[i] > 0])
    v_kept, g_kept = _value_and_grad(logp, adv, m12, mode, _mini_scale(m12[keep]), [keep])
    torch.testing.assert_close(v, v_kept, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g_kept, rtol=1e-12, atol=1e-12)
    assert g[5].eq(0).all()


# --------------------------------------------------------------------------------------------- data parallel


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("rank_rows", [6, 3, 9])
def test_two_dp_ranks_average_to_the_single_rank_value(mode, rank_rows):
    """Each rank's share with dp_size=2 and the global counts; FSDP averages the two ranks' gradients."""
    logp, adv, mask, _ = _case()
    whole_v, whole_g = _whole(logp, adv, mask, mode, _mini_scale(mask))
    scale = _mini_scale(mask, dp_size=2)  # global counts, over both ranks
    ranks = [slice(0, rank_rows), slice(rank_rows, N)]
    shares = []
    grads = []
    for rows in ranks:  # each rank micro-batches its own rows (2 micro-batches)
        k = rows.stop - rows.start
        micro = [slice(rows.start, rows.start + k // 2), slice(rows.start + k // 2, rows.stop)]
        v, g = _value_and_grad(logp, adv, mask, mode, scale, micro)
        shares.append(v)
        grads.append(g)
    torch.testing.assert_close((shares[0] + shares[1]) / 2, whole_v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((grads[0] + grads[1]) / 2, whole_g, rtol=1e-12, atol=1e-12)


# --- clip_cov / kl_cov (Cui et al. 2025; verl's compute_policy_loss_clip_cov / _kl_cov) -------------------------

# Eight trained tokens. mean A = (3 + 3 - 6) / 8 = 0; mean logp = -24 / 8 = -3, so logp - mean = [[2, -2, 2, -2], 0]
# and cov = A (logp - mean logp) = [[6, -6, -2, 2], [0, 0, 0, 0]].
COV_ADV = torch.tensor([[3.0, 3.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]])
COV_LOGP = torch.tensor([[-1.0, -5.0, -1.0, -5.0], [-3.0, -3.0, -3.0, -3.0]])
COV = torch.tensor([[6.0, -6.0, -2.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
ONES = torch.ones(2, 4)


def test_covariance_by_hand_and_over_the_mask_only():
    torch.testing.assert_close(covariance_bt(COV_ADV, COV_LOGP, ONES), COV)
    # MASK keeps (0,0), (0,1), (0,2), (1,0): mean A = (3 + 3 - 1 - 1) / 4 = 1, mean logp = (-1 - 5 - 1 - 3) / 4 = -2.5
    got = covariance_bt(COV_ADV, COV_LOGP, MASK)
    torch.testing.assert_close(got[0, :3], torch.tensor([2.0 * 1.5, 2.0 * -2.5, -2.0 * 1.5]))
    torch.testing.assert_close(got[1, 0], torch.tensor(-2.0 * -0.5))


def _clip_cov(old: torch.Tensor, ratio: float, lb: float = 1.0, ub: float = 7.0, seed: int = 0, logp=COV_LOGP):
    gen = torch.Generator().manual_seed(seed)
    return clip_cov_loss(
        logp, old, COV_ADV, ONES, 0.2, 0.2, clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub, generator=gen
    )


def test_clip_cov_by_hand():
    # (0,0) has ratio 1.5 with A = 3 > 0: PPO clips it, so it is no candidate even though its cov 6 is in (1, 7);
    # (0,3) (cov 2) is the only candidate. n = int(0.25 * 8) = 2, but one candidate: it alone is selected.
    old = COV_LOGP.clone()
    old[0, 0] -= math.log(1.5)
    logp = COV_LOGP.clone().requires_grad_(True)
    out = _clip_cov(old, 0.25, logp=logp)
    expected_loss = torch.tensor([[-3.0 * 1.2, -3.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(out.loss_bt, expected_loss)
    selected = torch.zeros(2, 4)
    selected[0, 3] = 1.0
    torch.testing.assert_close(out.clipped_bt, selected)  # verl's pg_clipfrac: the selected tokens only
    torch.testing.assert_close(out.approx_kl_bt, old - COV_LOGP)
    assert torch.all(out.dual_clipped_bt == 0)
    out.loss_bt.sum().backward()
    assert logp.grad is not None
    # -A r on the unclipped, unselected tokens; 0 on the PPO-clipped (0,0) and on the selected (0,3)
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -3.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))


def test_clip_cov_window_bounds_are_strict():
    # cov 6 and 2 in (1, 7); with ub = 6 only 2 is inside, with lb = 2 only 6 is
    assert _clip_cov(COV_LOGP, 1.0).clipped_bt.sum() == 2
    torch.testing.assert_close(_clip_cov(COV_LOGP, 1.0, ub=6.0).clipped_bt[0], torch.tensor([0.0, 0.0, 0.0, 1.0]))
    torch.testing.assert_close(_clip_cov(COV_LOGP, 1.0, lb=2.0).clipped_bt[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_clip_cov_draws_n_of_the_candidates_reproducibly():
    # on-policy: candidates (0,0) and (0,3). ratio 0.125 or verl's 0.0002: n = max(int(r * 8), 1) = 1 of the two
    picks = set()
    for seed in range(16):
        for ratio in (0.125, 0.0002):
            out = _clip_cov(COV_LOGP, ratio, seed=seed)
            assert out.clipped_bt.sum() == 1 and out.clipped_bt[0, 0] + out.clipped_bt[0, 3] == 1
            picks.add(int(out.clipped_bt[0, 3]))
            again = _clip_cov(COV_LOGP, ratio, seed=seed)
            assert torch.equal(out.clipped_bt, again.clipped_bt)  # the same generator seed draws the same token
    assert picks == {0, 1}  # both candidates are drawn across seeds


@pytest.mark.parametrize(("ratio", "count"), [(0.0002, 1), (0.0025, 2), (0.01, 10), (0.5, 500), (1.0, 1000)])
def test_clip_cov_selection_count_from_the_ratio(ratio: float, count: int):
    gen = torch.Generator().manual_seed(1)
    logp = torch.randn(10, 100, generator=gen)
    adv = torch.randn(10, 100, generator=gen)
    out = clip_cov_loss(
        logp, logp, adv, torch.ones(10, 100), 0.2, 0.2, clip_cov_ratio=ratio, clip_cov_lb=-1e9, clip_cov_ub=1e9
    )
    assert out.clipped_bt.sum() == count  # every on-policy token is a candidate; n = max(int(ratio * 1000), 1)
    assert torch.all(out.loss_bt[out.clipped_bt.bool()] == 0)


def test_clip_cov_ignores_masked_tokens_and_empty_micro_batches():
    mask = ONES.clone()
    mask[0, 3] = 0.0  # drop (0,3): means over 7 tokens; (0,0) keeps cov (3 - 3/7)(-1 + 19/7) = 4.41 in (1, 7)
    out = clip_cov_loss(
        COV_LOGP, COV_LOGP, COV_ADV, mask, 0.2, 0.2, clip_cov_ratio=1.0, clip_cov_lb=1.0, clip_cov_ub=7.0
    )
    torch.testing.assert_close(out.clipped_bt, torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0] * 4]))
    empty = clip_cov_loss(
        COV_LOGP, COV_LOGP, COV_ADV, torch.zeros(2, 4), 0.2, 0.2, clip_cov_ratio=1.0, clip_cov_lb=1.0, clip_cov_ub=7.0
    )
    assert empty.clipped_bt.sum() == 0


# off-policy log ratios d = logp - old
KL_D = torch.tensor([[0.1, 0.2, -0.1, -0.3], [0.05, 0.0, 0.0, 0.0]])


def test_kl_cov_by_hand():
    # k = int(8 * 0.25) = 2: the largest covariances 6 at (0,0) and 2 at (0,3) get 2 |d|; no clip anywhere
    logp = COV_LOGP.clone().requires_grad_(True)
    out = kl_cov_loss(logp, COV_LOGP - KL_D, COV_ADV, ONES, kl_cov_ratio=0.25, ppo_kl_coef=2.0)
    r = KL_D.exp()
    expected = -COV_ADV * r
    expected[0, 0] += 2.0 * 0.1
    expected[0, 3] += 2.0 * 0.3
    torch.testing.assert_close(out.loss_bt, expected)
    assert out.loss_bt[0, 0].item() == pytest.approx(-3 * math.exp(0.1) + 0.2)
    torch.testing.assert_close(out.ratio_bt, r)
    torch.testing.assert_close(out.clipped_bt, torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0] * 4]))
    torch.testing.assert_close(out.approx_kl_bt, KL_D.abs())  # verl's actor/ppo_kl for kl_cov
    out.loss_bt.sum().backward()
    assert logp.grad is not None
    grad = -COV_ADV * r
    grad[0, 0] += 2.0  # d|d|/dlogp = sign(d)
    grad[0, 3] -= 2.0
    torch.testing.assert_close(logp.grad, grad)


@pytest.mark.parametrize(("ratio", "count"), [(0.0002, 1), (0.125, 1), (0.25, 2), (0.5, 4), (1.0, 8)])
def test_kl_cov_selection_count_is_the_top_covariances(ratio: float, count: int):
    out = kl_cov_loss(COV_LOGP, COV_LOGP - KL_D, COV_ADV, ONES, kl_cov_ratio=ratio, ppo_kl_coef=1.0)
    assert out.clipped_bt.sum() == count
    # every selected token's covariance is at least every unselected one's
    sel = out.clipped_bt.bool()
    assert count == 8 or COV[sel].min() >= COV[~sel].max()


def test_kl_cov_plain_means_over_the_trained_tokens():
    # MASK's 4 tokens: A [3, 3, -1, -1] (mean 1), logp [-1, -5, -1, -3] (mean -2.5): cov [3, -5, -1.5, 0.5];
    # k = max(1, int(4 * 0.5)) = 2: (0,0) and (1,0); the masked tokens never
    out = kl_cov_loss(COV_LOGP, COV_LOGP - KL_D, COV_ADV, MASK, kl_cov_ratio=0.5, ppo_kl_coef=1.0)
    torch.testing.assert_close(out.clipped_bt, torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    none = kl_cov_loss(COV_LOGP, COV_LOGP - KL_D, COV_ADV, torch.zeros(2, 4), kl_cov_ratio=0.5, ppo_kl_coef=1.0)
    assert none.clipped_bt.sum() == 0


def test_policy_loss_picks_the_configured_mode_not_vanilla():
    # ratio 1.5 at (0,0) with A > 0: vanilla clips it, kl_cov does not (and penalises it: top covariance);
    # clip_cov zeroes the loss of (0,3), its only candidate, which vanilla trains
    old = COV_LOGP.clone()
    old[0, 0] -= math.log(1.5)
    vanilla = ppo_clip_loss(COV_LOGP, old, COV_ADV, 0.2, 0.2, clip_c=3.0).loss_bt
    assert torch.equal(policy_loss(ActorConfig(), COV_LOGP, old, COV_ADV, ONES).loss_bt, vanilla)
    clip_cfg = ActorConfig(policy_loss="clip_cov", clip_cov_ratio=0.25, clip_cov_ub=7.0)
    clip = policy_loss(clip_cfg, COV_LOGP, old, COV_ADV, ONES, torch.Generator().manual_seed(0))
    assert clip.loss_bt[0, 3] == 0 and vanilla[0, 3] != 0
    kl = policy_loss(ActorConfig(policy_loss="kl_cov", kl_cov_ratio=0.25), COV_LOGP, old, COV_ADV, ONES)
    assert kl.loss_bt[0, 0].item() == pytest.approx(-3 * 1.5 + math.log(1.5))  # vanilla's is -3 * 1.2
    torch.testing.assert_close(
        kl.loss_bt, kl_cov_loss(COV_LOGP, old, COV_ADV, ONES, kl_cov_ratio=0.25, ppo_kl_coef=1.0).loss_bt
    )
    gspo = policy_loss(ActorConfig(policy_loss="gspo"), COV_LOGP, old, COV_ADV, ONES).loss_bt
    torch.testing.assert_close(gspo, gspo_loss(COV_LOGP, old, COV_ADV, ONES, 0.2, 0.2).loss_bt)
    with pytest.raises(ValueError, match="clip_cov, kl_cov"):
        policy_loss(ActorConfig(policy_loss="dpo"), COV_LOGP, old, COV_ADV, ONES)


def test_selection_generator_is_keyed():
    def draw(*keys: int) -> list[int]:
        return torch.randperm(50, generator=selection_generator(*keys)).tolist()

    assert draw(1, 2, 3, 0) == draw(1, 2, 3, 0)
    assert len({tuple(draw(*k)) for k in [(1, 2, 3, 0), (1, 2, 4, 0), (1, 3, 3, 0), (2, 2, 3, 0), (1, 2, 3, 1)]}) == 5
