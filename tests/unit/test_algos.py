"""GRPO advantages, the PPO clipped surrogate and loss aggregation, against numbers worked out by hand."""

import math

import pytest
import torch

from torchrl_post.algos.advantages import grpo_advantages
from torchrl_post.algos.policy_loss import LossScale, agg_loss, masked_mean, ppo_clip_loss

# --- grpo_advantages ----------------------------------------------------------------------------------------


def test_grpo_advantages_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    mask = torch.ones(8, 3)
    adv = grpo_advantages(scores, 4, mask)
    assert adv.shape == (8, 3)
    # group 1: mean 0.5, deviations +-0.5, unbiased var = 4 * 0.25 / 3 = 1/3
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    expected = torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected[:, None].expand(8, 3))


def test_grpo_advantages_uneven_group():
    scores = torch.tensor([3.0, 0.0, 0.0])
    adv = grpo_advantages(scores, 3, torch.ones(3, 1))
    # mean 1, deviations [2, -1, -1], unbiased var = (4 + 1 + 1) / 2 = 3
    std = math.sqrt(3.0)
    expected = torch.tensor([2.0, -1.0, -1.0]) / (std + 1e-6)
    torch.testing.assert_close(adv[:, 0], expected)


def test_grpo_advantages_masked_tokens_are_zero():
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    adv = grpo_advantages(scores, 2, mask)
    assert torch.all(adv[mask == 0] == 0)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # group [1, 0]: mean 0.5, unbiased var 0.5
    torch.testing.assert_close(adv[0], torch.tensor([a, a, 0.0]))
    torch.testing.assert_close(adv[1], torch.tensor([-a, 0.0, 0.0]))
    assert torch.all(adv[2:] == 0)


def test_grpo_advantages_each_group_sums_to_zero():
    torch.manual_seed(0)
    scores = torch.rand(12)
    adv = grpo_advantages(scores, 4, torch.ones(12, 1))[:, 0]
    sums = adv.view(3, 4).sum(dim=1)
    torch.testing.assert_close(sums, torch.zeros(3), atol=1e-5, rtol=0)
    assert adv.abs().sum() > 0
    # normalised by the group std: each group's advantages have unbiased std ~1
    torch.testing.assert_close(adv.view(3, 4).std(dim=1), torch.ones(3), atol=1e-4, rtol=0)


def test_grpo_advantages_without_std_is_plain_centering():
    scores = torch.tensor([2.0, 0.0, 1.0, 5.0, 5.0, 8.0])
    adv = grpo_advantages(scores, 3, torch.ones(6, 2), norm_by_std=False)
    expected = torch.tensor([1.0, -1.0, 0.0, -1.0, -1.0, 2.0])
    torch.testing.assert_close(adv, expected[:, None].expand(6, 2))


def test_grpo_advantages_accepts_integer_scores():
    adv = grpo_advantages(torch.tensor([1, 0]), 2, torch.ones(2, 1), norm_by_std=False)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5]))


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


# --- agg_loss / masked_mean ---------------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


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
