"""Tests of torchrl_post/algos/distill.py: the on-policy distillation losses against hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from torchrl_post.algos.distill import (
    distillation_advantages,
    distillation_weight,
    forward_kl_topk,
    reverse_kl_estimate,
)
from torchrl_post.algos.kl import KL_KINDS
from torchrl_post.algos.policy_loss import ppo_clip_loss

# d = log p_s - log p_t = +1 and -1
STUDENT = torch.tensor([[-1.0, -2.0]])
TEACHER = torch.tensor([[-2.0, -1.0]])


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("k1", [1.0, -1.0]),
        ("kl", [1.0, -1.0]),
        ("abs", [1.0, 1.0]),
        ("k2", [0.5, 0.5]),
        ("mse", [0.5, 0.5]),
        # x = -d: e^x - x - 1 = e^-1 and e - 2
        ("k3", [math.exp(-1.0), math.e - 2.0]),
        ("low_var_kl", [math.exp(-1.0), math.e - 2.0]),
    ],
)
def test_reverse_kl_estimate_by_hand(mode: str, want: list[float]):
    torch.testing.assert_close(reverse_kl_estimate(STUDENT, TEACHER, mode), torch.tensor([want]))


def test_reverse_kl_estimate_modes_are_verls_names_and_unknown_refused():
    assert set(KL_KINDS) == {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}  # verl's estimator loss modes
    with pytest.raises(ValueError, match="k3"):
        reverse_kl_estimate(STUDENT, TEACHER, "forward_kl_topk")


def test_reverse_kl_estimate_loss_max_clamp_is_two_sided():
    # verl clamps to [-c, c]: k1's negative estimates too
    got = reverse_kl_estimate(STUDENT * 3, TEACHER * 3, "k1", loss_max_clamp=0.5)  # d = +3, -3
    torch.testing.assert_close(got, torch.tensor([[0.5, -0.5]]))
    k3 = reverse_kl_estimate(STUDENT, TEACHER, "k3", loss_max_clamp=0.5)
    torch.testing.assert_close(k3, torch.tensor([[math.exp(-1.0), 0.5]]))


def test_reverse_kl_estimate_gradient_reaches_the_student_only():
    student = STUDENT.clone().requires_grad_(True)
    teacher = TEACHER.clone().requires_grad_(True)
    reverse_kl_estimate(student, teacher, "k3").sum().backward()
    assert student.grad is not None
    # d/ds (e^(t - s) - (t - s) - 1) = 1 - e^(t - s)
    torch.testing.assert_close(student.grad, 1.0 - (TEACHER - STUDENT).exp())


# A 5-token vocabulary: the teacher's distribution, the student's uniform one
P_T = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
P_S = torch.full((5,), 0.2)


def _topk(k: int, p_s: torch.Tensor = P_S) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, 1, k] log-probabilities of the teacher's top-k ids under the student and the teacher."""
    ids = P_T.argsort(descending=True)[:k]
    return p_s.log()[ids].view(1, 1, k), P_T.log()[ids].view(1, 1, k)


def test_forward_kl_topk_with_the_whole_vocabulary_is_the_exact_kl():
    student, teacher = _topk(5)
    got = forward_kl_topk(student, teacher, torch.ones(1, 1))
    exact = sum(p * math.log(p / 0.2) for p in P_T.tolist())
    assert got.loss_bt.item() == pytest.approx(exact, rel=1e-6)
    torch.testing.assert_close(
        got.loss_bt.view(()), torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="sum")
    )
    assert got.student_mass_bt.item() == pytest.approx(1.0) and got.teacher_mass_bt.item() == pytest.approx(1.0)


def test_forward_kl_topk_gradient_to_the_student_logits():
    # with k = the vocabulary: d KL(p_t || softmax(z)) / dz = softmax(z) - p_t
    logits = torch.tensor([0.3, -1.0, 2.0, 0.0, 0.5], requires_grad=True)
    student_lp = logits.log_softmax(-1)
    ids = P_T.argsort(descending=True)
    forward_kl_topk(
        student_lp[ids].view(1, 1, 5), P_T.log()[ids].view(1, 1, 5), torch.ones(1, 1)
    ).loss_bt.sum().backward()
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, logits.detach().softmax(-1) - P_T)


def test_forward_kl_topk_is_not_renormalised_and_has_no_tail():
    # top-2 (0.4, 0.3): 0.4 ln(0.4 / 0.2) + 0.3 ln(0.3 / 0.2); the other 0.3 of the teacher's mass is dropped
    got = forward_kl_topk(*_topk(2), torch.ones(1, 1))
    assert got.loss_bt.item() == pytest.approx(0.4 * math.log(2.0) + 0.3 * math.log(1.5), rel=1e-6)
    assert got.teacher_mass_bt.item() == pytest.approx(0.7) and got.student_mass_bt.item() == pytest.approx(0.4)


def test_forward_kl_topk_negative_sum_is_floored_at_zero():
    # the student puts more mass on the top-2 than the teacher: 0.4 ln(0.4/0.6) + 0.3 ln(0.3/0.35) < 0 -> 0
    student = torch.tensor([0.6, 0.35, 0.02, 0.02, 0.01])
    got = forward_kl_topk(*_topk(2, student), torch.ones(1, 1))
    assert 0.4 * math.log(0.4 / 0.6) + 0.3 * math.log(0.3 / 0.35) < 0
    assert got.loss_bt.item() == 0.0


def test_forward_kl_topk_clamps():
    teacher = torch.tensor([[[math.log(0.5), -3.0]]])
    student = torch.tensor([[[math.log(0.25), -8.0]]])
    plain = forward_kl_topk(student, teacher, torch.ones(1, 1)).loss_bt.item()
    assert plain == pytest.approx(0.5 * math.log(2.0) + math.exp(-3.0) * 5.0, rel=1e-6)
    # log_prob_min_clamp -5: the student's -8 becomes -5 (the teacher's -3 stays)
    clamped = forward_kl_topk(student, teacher, torch.ones(1, 1), log_prob_min_clamp=-5.0).loss_bt.item()
    assert clamped == pytest.approx(0.5 * math.log(2.0) + math.exp(-3.0) * 2.0, rel=1e-6)
    capped = forward_kl_topk(student, teacher, torch.ones(1, 1), loss_max_clamp=0.1).loss_bt.item()
    assert capped == pytest.approx(0.1)


def test_forward_kl_topk_masked_tokens_are_zero():
    student, teacher = _topk(3)
    two_s, two_t = torch.cat([student, student], 1), torch.cat([teacher, teacher], 1)
    got = forward_kl_topk(two_s, two_t, torch.tensor([[1.0, 0.0]]))
    assert got.loss_bt[0, 0] > 0 and got.loss_bt[0, 1] == 0


def test_distillation_advantages_and_weight():
    kl = torch.tensor([[0.5, -0.2]], requires_grad=True)
    with_task = distillation_advantages(kl, 0.3, use_task_rewards=True)
    torch.testing.assert_close(with_task, torch.tensor([[-0.15, 0.06]]))
    assert not with_task.requires_grad
    torch.testing.assert_close(distillation_advantages(kl, 0.3, use_task_rewards=False), torch.tensor([[-0.5, 0.2]]))
    assert distillation_weight(0.3, True) == 0.3 and distillation_weight(0.3, False) == 1.0


def test_ppo_over_weighted_advantages_is_the_weighted_ppo_loss():
    # why distillation_advantages may carry the weight: PPO (clip and dual clip) is positively homogeneous in A
    logp = torch.tensor([[0.0, 0.3, -0.4, 1.5, -1.2]])
    adv = torch.tensor([[1.0, 2.0, -1.0, -3.0, 0.5]])
    for w in (0.0, 0.3, 2.5):
        weighted = ppo_clip_loss(logp, torch.zeros_like(logp), w * adv, 0.2, 0.2, clip_c=3.0).loss_bt
        torch.testing.assert_close(
            weighted, w * ppo_clip_loss(logp, torch.zeros_like(logp), adv, 0.2, 0.2, clip_c=3.0).loss_bt
        )
