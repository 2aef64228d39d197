"""Tests of torchrl_post/algos/value_loss.py: the clipped value loss by hand."""

import pytest
import torch

from torchrl_post.algos.policy_loss import LossScale
from torchrl_post.algos.value_loss import clipped_value_loss

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


def test_no_value_clipping_is_the_plain_squared_error():
    # (0,0): 0.5 * (1 - 1.5)^2 = 0.125 (the clipped term 0.18 is not taken); (0,1) 0.5; (1,0) 3.125
    loss, clipfrac = clipped_value_loss(V, V_OLD, RET, V_MASK, None, "token-mean")
    assert loss.item() == pytest.approx((0.125 + 0.5 + 3.125) / 3)
    assert clipfrac.item() == 0.0


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
