"""GAE, REINFORCE(++), RLOO, reward placement, KL penalties and controllers, dual clip, GSPO and the clipped
value loss, against numbers worked out by hand (small tensors, masks with uneven lengths)."""

import math
import statistics

import pytest
import torch

from torchrl_post.algos.advantages import (
    gae_advantages,
    masked_whiten,
    reinforce_plus_plus_advantages,
    reinforce_returns,
    rloo_advantages,
    scores_to_token_rewards,
)
from torchrl_post.algos.kl import AdaptiveKLController, FixedKLController, apply_kl_in_reward, kl_penalty
from torchrl_post.algos.policy_loss import LossScale, gspo_loss, ppo_clip_loss
from torchrl_post.algos.value_loss import clipped_value_loss

# Two rows: 3 real tokens and 1 real token, width 4 (right padding).
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


def _whiten_by_hand(xs: list[float]) -> list[float]:
    """(x - mean) / sqrt(unbiased var + 1e-8), with plain Python floats."""
    mean = statistics.fmean(xs)
    var = statistics.variance(xs)  # unbiased (n - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


def _masked_unbiased_std(x: torch.Tensor, mask: torch.Tensor) -> float:
    return statistics.stdev(x[mask > 0].tolist())


# --- masked_whiten ------------------------------------------------------------------------------------------


def test_masked_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    out = masked_whiten(x, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    # real entries 1, 2, 3: mean 2, unbiased var ((1 + 0 + 1) / 2) = 1 (a biased var would be 2/3)
    s = 1 / math.sqrt(1 + 1e-8)
    torch.testing.assert_close(out[0, :3], torch.tensor([-s, 0.0, s]))


def test_masked_whiten_single_entry_is_zero_not_nan():
    out = masked_whiten(torch.tensor([[5.0, 7.0]]), torch.tensor([[1.0, 0.0]]))
    assert out[0, 0].item() == 0.0


# --- gae_advantages -----------------------------------------------------------------------------------------


def test_gae_by_hand():
    # masked positions hold garbage rewards/values that must not leak in
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0], [2.0, 7.0, 7.0, 7.0]])
    values = torch.tensor([[0.5, 0.4, 0.2, 9.0], [1.0, 3.0, 3.0, 3.0]])
    adv, ret = gae_advantages(rewards, values, MASK, gamma=0.9, lam=0.8)
    # row 0, right to left (next value after the last real token is 0):
    #   t=2: delta = 1 + 0.9*0 - 0.2 = 0.8;        A2 = 0.8
    #   t=1: delta = 0 + 0.9*0.2 - 0.4 = -0.22;    A1 = -0.22 + 0.72*0.8 = 0.356
    #   t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14;    A0 = -0.14 + 0.72*0.356 = 0.11632
    # row 1: t=0: delta = 2 + 0 - 1 = 1;         A0 = 1
    raw = [0.11632, 0.356, 0.8, 1.0]
    expected_ret = torch.tensor([[0.61632, 0.756, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(ret, expected_ret)
    w = _whiten_by_hand(raw)
    expected_adv = torch.tensor([[w[0], w[1], w[2], 0.0], [w[3], 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected_adv)


def test_gae_gamma_lam_one_returns_are_future_reward_sums():
    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]])
    rewards = torch.randn(3, 5)
    values = torch.randn(3, 5)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    future = (rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(ret, future)
    # returns = adv_raw + values, so the unwhitened advantage is (sum of future rewards) - V on real tokens
    adv_raw = (ret - values) * mask
    torch.testing.assert_close(adv_raw, (future - values) * mask)
    # and the returned advantages are exactly that quantity, whitened over the batch
    w = _whiten_by_hand(adv_raw[mask > 0].tolist())
    torch.testing.assert_close(adv[mask > 0], torch.tensor(w))
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


def test_gae_advantages_whitened_returns_not():
    torch.manual_seed(1)
    rewards = torch.randn(2, 4) * 3 + 2
    values = torch.randn(2, 4)
    adv, ret = gae_advantages(rewards, values, MASK, gamma=0.99, lam=0.95)
    assert (adv * MASK).sum().item() == pytest.approx(0.0, abs=1e-5)
    assert _masked_unbiased_std(adv, MASK) == pytest.approx(1.0, abs=1e-4)
    assert _masked_unbiased_std(ret, MASK) != pytest.approx(1.0, abs=1e-2)


# --- reinforce_returns / reinforce_plus_plus_advantages -----------------------------------------------------


def test_reinforce_returns_by_hand_gamma_half():
    rewards = torch.tensor([[1.0, 2.0, 4.0, 8.0], [3.0, 5.0, 5.0, 5.0]])
    ret = reinforce_returns(rewards, MASK, gamma=0.5)
    # row 0: G2 = 4; G1 = 2 + 0.5*4 = 4; G0 = 1 + 0.5*4 = 3 (the masked 8 must not count); row 1: G0 = 3
    torch.testing.assert_close(ret, torch.tensor([[3.0, 4.0, 4.0, 0.0], [3.0, 0.0, 0.0, 0.0]]))


def test_reinforce_plus_plus_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 4.0, 8.0], [3.0, 5.0, 5.0, 5.0]])
    adv, ret = reinforce_plus_plus_advantages(rewards, MASK, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[3.0, 4.0, 4.0, 0.0], [3.0, 0.0, 0.0, 0.0]]))
    # real returns 3, 4, 4, 3: mean 3.5, unbiased var = 4 * 0.25 / 3 = 1/3
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[-a, a, a, 0.0], [-a, 0.0, 0.0, 0.0]]))


def test_reinforce_plus_plus_whitened_stats():
    torch.manual_seed(2)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] + [0.0] * 5])
    adv, ret = reinforce_plus_plus_advantages(torch.randn(3, 6) + 1.0, mask, gamma=0.9)
    assert (adv * mask).sum().item() / mask.sum().item() == pytest.approx(0.0, abs=1e-5)
    assert _masked_unbiased_std(adv, mask) == pytest.approx(1.0, abs=1e-4)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


# --- rloo_advantages ----------------------------------------------------------------------------------------


def test_rloo_by_hand_leave_one_out():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0])
    mask = torch.ones(8, 2)
    mask[1, 1] = 0.0
    adv = rloo_advantages(scores, 4, mask)
    # A_i = r_i - mean of the other three: group 1: 1 - 1/3 = 2/3, 0 - 2/3 = -2/3; group 2: 2 - 6 = -4, 4 - 16/3, ...
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, -4.0, 4 - 16 / 3, 6 - 14 / 3, 8 - 4.0])
    torch.testing.assert_close(adv[:, 0], expected)
    torch.testing.assert_close(adv[:, 1], expected * mask[:, 1])
    assert adv[1, 1].item() == 0.0


def test_rloo_equals_scaled_centering_and_groups_sum_to_zero():
    torch.manual_seed(3)
    n = 3
    scores = torch.rand(12)
    adv = rloo_advantages(scores, n, torch.ones(12, 1))[:, 0]
    groups = scores.view(-1, n)
    torch.testing.assert_close(adv, (n / (n - 1) * (groups - groups.mean(1, keepdim=True))).flatten())
    torch.testing.assert_close(adv.view(-1, n).sum(1), torch.zeros(4), atol=1e-6, rtol=0)


def test_rloo_n_two_and_uneven_mask():
    adv = rloo_advantages(torch.tensor([3.0, 1.0]), 2, torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0, 2.0], [-2.0, 0.0, 0.0]]))


def test_rloo_rejects_n_below_two():
    with pytest.raises(ValueError, match="n=1"):
        rloo_advantages(torch.tensor([1.0, 2.0]), 1, torch.ones(2, 1))


# --- scores_to_token_rewards --------------------------------------------------------------------------------


def test_scores_to_token_rewards_last_real_token():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    out = scores_to_token_rewards(torch.tensor([0.5, -1.0, 7.0, 2.0]), mask)
    expected = torch.tensor([[0.0, 0.0, 0.5, 0.0], [-1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    torch.testing.assert_close(out, expected)


# --- kl_penalty ---------------------------------------------------------------------------------------------

LOGP = torch.tensor([[-1.0, -2.0, -0.5]])
REF = torch.tensor([[-1.5, -2.0, -0.2]])  # logp - ref = [0.5, 0, -0.3]; the last token is masked in KL_MASK
KL_MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_kl_k1_abs_k2_by_hand():
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k1"), torch.tensor([[0.5, 0.0, -0.3]]))
    torch.testing.assert_close(kl_penalty(LOGP, REF, "abs"), torch.tensor([[0.5, 0.0, 0.3]]))
    for kind in ("mse", "k2"):
        torch.testing.assert_close(kl_penalty(LOGP, REF, kind), torch.tensor([[0.125, 0.0, 0.045]]))


def test_kl_k3_by_hand():
    # x = ref - logp = [-0.5, 0, 0.3]; kl = e^x - x - 1
    expected = torch.tensor([[math.exp(-0.5) + 0.5 - 1, 0.0, math.exp(0.3) - 0.3 - 1]])
    for kind in ("low_var_kl", "k3"):
        torch.testing.assert_close(kl_penalty(LOGP, REF, kind), expected)


def test_kl_k3_clamps():
    logp = torch.tensor([[0.0, -30.0, -1.0]])
    ref = torch.tensor([[-30.0, 0.0, -6.0]])
    out = kl_penalty(logp, ref, "k3")
    # x=-30 -> clamped to -20: e^-20 + 19 -> clamped to 10; x=30 -> 20: e^20 - 21 -> 10; x=-5: e^-5 + 4 (no clamp)
    torch.testing.assert_close(out, torch.tensor([[10.0, 10.0, math.exp(-5.0) + 4.0]]))


def test_kl_k3_nonnegative_and_zero_on_policy():
    torch.manual_seed(4)
    logp = torch.randn(4, 7) * 3
    ref = torch.randn(4, 7) * 3
    assert torch.all(kl_penalty(logp, ref, "k3") >= 0)
    assert torch.all(kl_penalty(logp, logp.clone(), "k3") == 0)


def test_kl_unknown_kind():
    with pytest.raises(ValueError, match=r"'k4'.*low_var_kl"):
        kl_penalty(LOGP, REF, "k4")


# --- apply_kl_in_reward -------------------------------------------------------------------------------------


def test_apply_kl_in_reward_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    kl = torch.tensor([[0.2, -0.1, 0.3, 9.0], [0.4, 9.0, 9.0, 9.0]])
    new, mean_kl = apply_kl_in_reward(rewards, kl, MASK, coef=0.5)
    torch.testing.assert_close(new, torch.tensor([[-0.1, 0.05, 0.85, 0.0], [1.8, 0.0, 0.0, 0.0]]))
    # per-sequence masked means 0.4/3 and 0.4 -> batch mean (a token mean would give 0.8/4 = 0.2)
    assert isinstance(mean_kl, float)
    assert mean_kl == pytest.approx((0.4 / 3 + 0.4) / 2)


def test_apply_kl_in_reward_masked_kind_in_pipeline():
    kl = kl_penalty(LOGP, REF, "k1")
    new, mean_kl = apply_kl_in_reward(torch.zeros(1, 3), kl, KL_MASK, coef=1.0)
    torch.testing.assert_close(new, torch.tensor([[-0.5, 0.0, 0.0]]))  # masked token's -0.3 is dropped
    assert mean_kl == pytest.approx(0.25)


# --- KL controllers -----------------------------------------------------------------------------------------


def test_adaptive_kl_controller_by_hand():
    ctl = AdaptiveKLController(init_coef=0.1, target_kl=6.0, horizon=10000)
    ctl.update(current_kl=12.0, n_steps=256)  # error 12/6 - 1 = 1 -> clipped to 0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))

    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    ctl.update(6.6, 256)  # error 0.1, inside the clip
    assert ctl.value == pytest.approx(0.1 * (1 + 0.1 * 256 / 10000))

    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    ctl.update(0.0, 256)  # error -1 -> clipped to -0.2
    assert ctl.value == pytest.approx(0.1 * (1 - 0.2 * 256 / 10000))


def test_kl_controllers_state_dict_and_fixed():
    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    ctl.update(12.0, 256)
    fresh = AdaptiveKLController(0.1, 6.0, 10000)
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.value == ctl.value != 0.1

    fixed = FixedKLController(0.05)
    fixed.update(100.0, 256)
    assert fixed.value == 0.05
    assert fixed.state_dict() == {"value": 0.05}
    fixed.load_state_dict({"value": 0.2})
    assert fixed.value == 0.2


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


# --- clipped_value_loss -------------------------------------------------------------------------------------

V = torch.tensor([[1.0, 2.0, 5.0], [0.5, 4.0, 4.0]])
V_OLD = torch.tensor([[0.7, 1.0, 0.0], [0.4, 0.0, 0.0]])
RET = torch.tensor([[1.5, 1.0, 0.0], [3.0, 0.0, 0.0]])
V_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
# (0,0): v_clip = 0.7 + 0.2 = 0.9; (1.0-1.5)^2 = 0.25 < (0.9-1.5)^2 = 0.36 -> clipped term, loss 0.18
# (0,1): v_clip = 1.2; (2-1)^2 = 1 > (1.2-1)^2 = 0.04 -> unclipped, loss 0.5
# (1,0): v - old = 0.1 inside the range; (0.5-3)^2 = 6.25 both -> loss 3.125, not counted as clipped
# the rest is masked garbage


def test_clipped_value_loss_token_mean():
    loss, clipfrac = clipped_value_loss(V, V_OLD, RET, V_MASK, 0.2, "token-mean")
    assert loss.item() == pytest.approx((0.18 + 0.5 + 3.125) / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)


def test_clipped_value_loss_other_modes():
    loss, _ = clipped_value_loss(V, V_OLD, RET, V_MASK, 0.2, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(((0.18 + 0.5) / 2 + 3.125) / 2)
    loss, _ = clipped_value_loss(V, V_OLD, RET, V_MASK, 0.2, "token-mean", LossScale(10.0, 2, 4))
    assert loss.item() == pytest.approx((0.18 + 0.5 + 3.125) / 10)


def test_clipped_value_loss_gradient():
    v = V.clone().requires_grad_(True)
    loss, _ = clipped_value_loss(v, V_OLD, RET, V_MASK, 0.2, "seq-mean-token-sum")
    loss.backward()
    # d/dv of 0.5 (v - R)^2 is (v - R), then / 2 sequences. (0,0) takes the clipped term, constant in v there
    # (the clamp is saturated) -> 0; (0,1): (2 - 1) / 2 = 0.5; (1,0): v_clip = v, both terms agree -> (0.5 - 3) / 2
    assert v.grad is not None
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, 0.5, 0.0], [-1.25, 0.0, 0.0]]))
