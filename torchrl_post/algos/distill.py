"""On-policy distillation math (verl 0.9.1's `distillation.distillation_loss.*`): pure per-token tensor functions.

The student samples; a frozen teacher scores the student's tokens. verl's keys and their defaults (the shipped
YAML, trainer/config/distillation/distillation.yaml, which a Hydra run gets; the DistillationLossConfig dataclass
defaults differ where noted):
- loss_mode = k3. Estimator modes kl/k1, abs, mse/k2, low_var_kl/k3: `reverse_kl_estimate` of KL(student ||
  teacher) at the sampled token. forward_kl_topk: `forward_kl_topk` over the teacher's top-k tokens.
- topk = 32 (dataclass: 128): the teacher's top-k for forward_kl_topk.
- log_prob_min_clamp = null (dataclass: -10.0): forward_kl_topk only; both top-k log-probabilities clamped from
  below before the sum. verl's estimator modes do not read it (verl/trainer/distillation/losses.py).
- loss_max_clamp = null (dataclass: 10.0): the per-token loss clamped to [-c, c] in every mode (the lower side
  is for k1, which can be negative); after the forward_kl_topk floor at 0.
- use_policy_gradient = false (dataclass: true). false: the per-token loss itself is aggregated
  (actor.loss_agg_mode) and backpropagated (a supervised loss; k1 is refused, its gradient ignores the teacher).
  true: -sg[loss] is the per-token advantage of a second vanilla PPO term (`distillation_advantages`).
- use_task_rewards = true; distillation_loss_coef = 1.0: the actor's loss is
  [use_task_rewards] x PPO(task advantages) + w x distillation term, w = coef if use_task_rewards else 1
  (`distillation_weight`). With use_task_rewards=false and use_policy_gradient=true verl still runs the task
  PPO loss (for its metrics) but adds 0 of it.
- clip_ratio = clip_ratio_low = clip_ratio_high = 0.2; policy_loss_mode = vanilla (the only one verl accepts):
  the PPO clip of the use_policy_gradient term; its dual clip is vanilla's default clip_ratio_c = 3.
The caller masks and aggregates; nothing here reads a mask except `forward_kl_topk`, which zeroes masked rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchrl_post.algos.kl import kl_penalty


def reverse_kl_estimate(
    student_lp_bt: torch.Tensor, teacher_lp_bt: torch.Tensor, mode: str, *, loss_max_clamp: float | None = None
) -> torch.Tensor:
    """Per-token single-sample estimate of KL(student || teacher) at the student's sampled token (verl's
    estimator loss modes are its `kl_penalty` with logprob = student, ref_logprob = teacher: `kl.kl_penalty`).

    With d = log p_s - log p_t: k1 / kl: d; abs: |d|; k2 / mse: d^2 / 2; k3 / low_var_kl: x = clamp(-d, -20, 20),
    clamp(e^x - x - 1, -10, 10). Then, with loss_max_clamp = c: clamp(estimate, -c, c). Differentiable in the
    student's logprobs (the supervised loss); `distillation_advantages` detaches it for the policy gradient.
    """
    estimate_bt = kl_penalty(student_lp_bt, teacher_lp_bt, mode)
    if loss_max_clamp is not None:
        estimate_bt = estimate_bt.clamp(-loss_max_clamp, loss_max_clamp)
    return estimate_bt


@dataclass
class TopkKL:
    loss_bt: torch.Tensor  # the per-token forward KL over the teacher's top-k, floored at 0 (and clamped)
    student_mass_bt: torch.Tensor  # sum_k p_s(k): the student's probability on the teacher's top-k (before clamps)
    teacher_mass_bt: torch.Tensor  # sum_k p_t(k) (verl logs both as distillation/student_mass, teacher_mass)


def forward_kl_topk(
    student_topk_lp_btk: torch.Tensor,
    teacher_topk_lp_btk: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    log_prob_min_clamp: float | None = None,
    loss_max_clamp: float | None = None,
) -> TopkKL:
    """Per-token forward KL(teacher || student) over the teacher's top-k tokens (verl's forward_kl_topk, FSDP path).

    `student_topk_lp_btk`: the student's full-vocabulary log-softmax gathered at the teacher's top-k ids (so the
    gradient reaches every student logit through the softmax normaliser); `teacher_topk_lp_btk`: the teacher's
    log-probabilities of those ids. With s_k, t_k clamped from below at log_prob_min_clamp (when set):
    loss = max(sum_k e^{t_k} (t_k - s_k), 0), then clamped to [-c, c] with loss_max_clamp = c, in float32.
    As in verl the teacher's top-k probabilities are not renormalised over the k and there is no tail term for the
    vocabulary outside them, so the sum can be negative: the floor at 0 is verl's. With k = the vocabulary it is
    the exact KL(p_t || p_s). Tokens with mask 0 get 0 (their inputs may be padding).
    """
    student = student_topk_lp_btk.float()
    teacher = teacher_topk_lp_btk.float()
    student_mass_bt = student.detach().exp().sum(-1)
    teacher_mass_bt = teacher.exp().sum(-1)
    if log_prob_min_clamp is not None:
        student = student.clamp(min=log_prob_min_clamp)
        teacher = teacher.clamp(min=log_prob_min_clamp)
    loss_bt = (teacher.exp() * (teacher - student)).sum(-1).clamp(min=0.0)
    if loss_max_clamp is not None:
        loss_bt = loss_bt.clamp(-loss_max_clamp, loss_max_clamp)
    loss_bt = torch.where(mask_bt > 0, loss_bt, torch.zeros_like(loss_bt))
    return TopkKL(loss_bt, student_mass_bt, teacher_mass_bt)


def distillation_weight(distillation_loss_coef: float, use_task_rewards: bool) -> float:
    """The distillation term's weight in the actor's loss (verl's distillation_ppo_loss): distillation_loss_coef
    beside the task's PPO loss (use_task_rewards), else 1."""
    return distillation_loss_coef if use_task_rewards else 1.0


def distillation_advantages(
    loss_bt: torch.Tensor, distillation_loss_coef: float, use_task_rewards: bool
) -> torch.Tensor:
    """use_policy_gradient=true: the per-token advantage -w sg[loss_bt], w = `distillation_weight` (loss_bt: the
    clamped `reverse_kl_estimate`, or `forward_kl_topk`'s loss).

    verl feeds -sg[loss] straight to a vanilla PPO loss as its advantages (no advantage estimator, no group
    normalisation, no discount), with the distillation clip ratios (0.2), and adds w times that loss to the actor's.
    The PPO loss is positively homogeneous in the advantage (L(wA) = w L(A) for w >= 0, dual clip included), so
    PPO over these advantages is exactly verl's weighted term. Summed into the task's advantages instead (one PPO
    term) it equals verl only where no token is clipped (e.g. on-policy), and it must not pass through the task's
    advantage estimator (GRPO would normalise it away).
    """
    return -distillation_weight(distillation_loss_coef, use_task_rewards) * loss_bt.detach()
