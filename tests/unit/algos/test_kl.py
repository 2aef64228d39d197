"""Tests of torchrl_post/algos/kl.py: KL estimators, the KL penalty in the reward and the KL controllers."""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.algos.helpers import MASK
from torchrl_post.algos.kl import KL_KINDS, AdaptiveKLController, FixedKLController, apply_kl_in_reward, kl_penalty

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
