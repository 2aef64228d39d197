"""Loss aggregation across micro-batches and ranks, and the KL estimators.

The contract of `agg_loss` with a mini-batch `LossScale` (tokens and valid rows of the whole mini-batch, the
constant max_response_length, dp_size): the sum of the micro-batches' shares equals one call on the whole
mini-batch, in value and in gradient, for every mode and every split (equal, uneven, token-budget micro-batches
from `micro_slices`). Also: each mode's value by hand, the Dr.GRPO constant not depending on the padded width,
all-zero (filtered) rows leaving every denominator, and two data-parallel ranks averaging to the single-rank
value. Then `kl_penalty`: aliases, hand-computed values, unknown names.
"""

from __future__ import annotations

import math

import pytest
import torch

from torchrl_post.algos.kl import KL_KINDS, kl_penalty
from torchrl_post.algos.policy_loss import LOSS_AGG_MODES, LossScale, agg_loss
from torchrl_post.workers.logprobs import chunks, micro_slices, trim_span

R = 8  # padded response width
L = 10  # data.max_response_length (deliberately not R)
P = 6  # padded prompt width
RESP_LENS = [8, 3, 5, 1, 7, 0, 6, 4, 8, 5, 3, 6]  # row 5 is filtered (all-zero mask)
PROMPT_LENS = [2, 6, 1, 4, 3, 5, 6, 1, 2, 3, 6, 4]
N = len(RESP_LENS)


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp leaf [N, R], adv [N, R], mask [N, R] right-padded, attention [N, P + R] left/right-padded)."""
    g = torch.Generator().manual_seed(1234)
    logp = (-torch.rand(N, R, generator=g, dtype=torch.float64) * 3).requires_grad_()
    adv = torch.randn(N, R, generator=g, dtype=torch.float64)
    cols = torch.arange(R)
    mask = (cols.unsqueeze(0) < torch.tensor(RESP_LENS).unsqueeze(1)).double()
    prompt = (torch.arange(P).unsqueeze(0) >= P - torch.tensor(PROMPT_LENS).unsqueeze(1)).long()
    attention = torch.cat([prompt, mask.long()], dim=1)
    return logp, adv, mask, attention


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


def test_micro_slices_with_token_budget_split_unevenly():
    _, _, _, attention = _case()
    budget = 40
    slices = micro_slices(attention, R, max_rows=N, token_budget=budget)
    assert [s.start for s in slices] == [0] + [s.stop for s in slices[:-1]] and slices[-1].stop == N
    sizes = [s.stop - s.start for s in slices]
    assert len(slices) >= 3 and len(set(sizes)) > 1, sizes
    for i, s in enumerate(slices):
        first, kept = trim_span(attention[s], R)
        width = P - first + kept
        assert sizes[i] == 1 or sizes[i] * width <= budget, (s, width)
        if s.stop < N:  # greedy: the next row would not have fit
            first, kept = trim_span(attention[s.start : s.stop + 1], R)
            assert (sizes[i] + 1) * (P - first + kept) > budget
    # without a budget: chunks of max_rows
    assert micro_slices(attention, R, max_rows=5, token_budget=0) == [slice(0, 5), slice(5, 10), slice(10, 12)]
    assert list(chunks(12, 5)) == [slice(0, 5), slice(5, 10), slice(10, 12)]


def test_micro_slices_hand_example():
    """Rows x trimmed width may reach the budget exactly; an empty response still counts one column."""
    full = torch.ones(5, 4, dtype=torch.long)  # P = 2, R = 2, every row 4 wide
    assert micro_slices(full, 2, max_rows=99, token_budget=8) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_slices(full, 2, max_rows=99, token_budget=3) == [slice(i, i + 1) for i in range(5)]  # >= 1 row
    short = torch.tensor([[0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1]])  # widths 2, 2, 2, 4
    assert micro_slices(short, 2, max_rows=99, token_budget=6) == [slice(0, 3), slice(3, 4)]
    empty = torch.tensor([[0, 1, 0, 0]] * 3)  # the forward keeps one response column: 2 wide each
    assert micro_slices(empty, 2, max_rows=99, token_budget=3) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    assert micro_slices(empty, 2, max_rows=99, token_budget=4) == [slice(0, 2), slice(2, 3)]


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


# ------------------------------------------------------------------------------------------------ kl_penalty


def test_kl_aliases_and_every_kind():
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(3, 5, generator=g) * 4
    ref = -torch.rand(3, 5, generator=g) * 4
    out = {k: kl_penalty(logp, ref, k) for k in KL_KINDS}
    for k, v in out.items():
        assert v.shape == logp.shape and torch.isfinite(v).all(), k
    assert torch.equal(out["kl"], out["k1"])
    assert torch.equal(out["mse"], out["k2"])
    assert torch.equal(out["low_var_kl"], out["k3"])
    assert not torch.equal(out["k1"], out["k2"]) and not torch.equal(out["k2"], out["k3"])
    for k in ("abs", "k2", "k3"):
        assert (out[k] >= 0).all(), k
    assert kl_penalty(logp, logp, "k3").eq(0).all()


def test_kl_hand_computed():
    logp = torch.tensor([0.0, -1.0], dtype=torch.float64)
    ref = torch.tensor([-0.5, -0.5], dtype=torch.float64)  # d = logp - ref = [0.5, -0.5]
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([0.5, -0.5], dtype=torch.float64))
    torch.testing.assert_close(kl_penalty(logp, ref, "abs"), torch.tensor([0.5, 0.5], dtype=torch.float64))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([0.125, 0.125], dtype=torch.float64))
    # k3: x = ref - logp = [-0.5, 0.5]; exp(x) - x - 1
    k3 = torch.tensor([math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), k3)
    # k3 is clamped at 10 (x itself at +-20)
    far = kl_penalty(torch.tensor([-30.0, 0.0]), torch.tensor([0.0, -30.0]), "k3")
    assert far[0].item() == 10.0  # x = 20 -> exp(20) - 21 -> 10
    assert far[1].item() == 10.0  # x = -20 -> ~19 -> 10
    # differentiable: d k2 / d logp = d
    lp = logp.clone().requires_grad_()
    (grad,) = torch.autograd.grad(kl_penalty(lp, ref, "k2").sum(), lp)
    torch.testing.assert_close(grad, torch.tensor([0.5, -0.5], dtype=torch.float64))


def test_kl_unknown_kind_lists_the_names():
    with pytest.raises(ValueError) as err:
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")
    msg = str(err.value)
    assert "k4" in msg
    for k in KL_KINDS:
        assert k in msg, k
