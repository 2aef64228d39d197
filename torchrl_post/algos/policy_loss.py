"""Policy losses (PPO clipped surrogate with optional dual clip, GSPO) and loss aggregation (verl's mode names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch

from torchrl_post.config.enums import LossAggMode

LOSS_AGG_MODES = get_args(LossAggMode)  # agg_loss dispatches on each


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass(frozen=True)
class LossScale:
    """The denominators of one mini-batch, counted over every micro-batch on every data-parallel rank.

    With them each micro-batch's `agg_loss` is its exact share of the mini-batch loss, so the summed
    gradient does not depend on how the mini-batch is split (row counts, token budgets, uneven tails).
    """

    tokens: float
    """Sum of the mask over the mini-batch (all ranks)."""
    seqs: float
    """Rows whose mask is not all zero (all ranks): filtered samples do not count."""
    max_response_length: int
    """data.max_response_length: the constant of seq-mean-token-sum-norm (Dr.GRPO)."""
    dp_size: int = 1
    """Ranks whose gradients FSDP averages: each rank's share is scaled up by it."""

    @staticmethod
    def local(mask_bt: torch.Tensor, max_response_length: int | None = None) -> LossScale:
        """The scale of `mask_bt` taken as the whole mini-batch on one rank."""
        seqs = float((mask_bt.sum(-1) > 0).sum())
        return LossScale(float(mask_bt.sum()), seqs, max_response_length or mask_bt.shape[-1])


def agg_loss(loss_bt: torch.Tensor, mask_bt: torch.Tensor, mode: str, scale: LossScale | None = None) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss (verl's loss_agg_mode names and definitions).

    With S = `scale` (default: this mask alone), m the mask, l the token losses, and "valid" the rows whose
    mask is not all zero:
    token-mean:              sum_bt l m / S.tokens
    seq-mean-token-sum:      sum_b (sum_t l m) / S.seqs
    seq-mean-token-mean:     sum_b (sum_t l m / sum_t m) / S.seqs           (valid rows only)
    seq-mean-token-sum-norm: sum_bt l m / (S.seqs * S.max_response_length)  (Dr.GRPO's constant normaliser,
                             as current verl: the batch size times the maximum response length)
    Each is multiplied by S.dp_size, since FSDP averages the ranks' gradients.
    """
    scale = scale or LossScale.local(mask_bt)
    if mode == "token-mean":
        return (loss_bt * mask_bt).sum() / (max(scale.tokens, 1.0) / scale.dp_size)
    seq_sum_b = (loss_bt * mask_bt).sum(-1)
    seqs = max(scale.seqs, 1.0) / scale.dp_size
    if mode == "seq-mean-token-sum":
        return seq_sum_b.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (seq_sum_b / mask_bt.sum(-1).clamp(min=1)).sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        return seq_sum_b.sum() / (seqs * scale.max_response_length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


@dataclass
class PolicyLossOut:
    loss_bt: torch.Tensor  # per-token loss, before aggregation
    ratio_bt: torch.Tensor
    clipped_bt: torch.Tensor  # 1.0 where the clipped branch was taken
    approx_kl_bt: torch.Tensor  # old_logp - logp (k1), for actor/ppo_kl
    dual_clipped_bt: torch.Tensor  # 1.0 where the dual-clip bound -A * clip_c was taken (A < 0); zeros otherwise


def ppo_clip_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    clip_c: float | None = None,
) -> PolicyLossOut:
    """Token-level PPO clipped surrogate: L = max(-A r, -A clip(r, 1 - low, 1 + high)), r = exp(logp - old_logp).

    Dual clip (Ye et al. 2020, verl's clip_ratio_c), when clip_c is given (> 1): for A < 0, L = min(L, -A clip_c),
    which bounds the loss (and zeroes the gradient) of negative-advantage tokens whose ratio exploded.
    """
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"dual-clip clip_c must be > 1, got {clip_c}")
    log_ratio_bt = (logp_bt - old_logp_bt).clamp(-20.0, 20.0)
    ratio_bt = log_ratio_bt.exp()
    unclipped_bt = -adv_bt * ratio_bt
    clipped_bt = -adv_bt * ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_bt = torch.maximum(unclipped_bt, clipped_bt)
    dual_clipped_bt = torch.zeros_like(loss_bt)
    if clip_c is not None:
        bound_bt = -adv_bt * clip_c
        use_bound_bt = (adv_bt < 0) & (loss_bt > bound_bt)
        loss_bt = torch.where(use_bound_bt, bound_bt, loss_bt)
        dual_clipped_bt = use_bound_bt.to(loss_bt.dtype)
    return PolicyLossOut(loss_bt, ratio_bt, (clipped_bt > unclipped_bt).float(), -log_ratio_bt, dual_clipped_bt)


def gspo_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> PolicyLossOut:
    """GSPO (Zheng et al. 2025, verl's gspo): sequence-level ratio with per-token gradient.

    s_b = exp(sum_t m_t (logp_t - old_t) / max(sum_t m_t, 1)); r_bt = sg[s_b] * exp(logp_t - sg[logp_t]), so r
    equals s_b on every token of a sequence while d r_bt / d logp_bt = s_b flows per token. As in verl, log r is
    clamped at 10. L = max(-A r, -A clip(r, 1 - low, 1 + high)); the clip ranges are small (e.g. 3e-4 / 4e-4).
    """
    mask = mask_bt.to(logp_bt.dtype)
    log_ratio_bt = logp_bt - old_logp_bt
    seq_log_ratio_b = (log_ratio_bt * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_seq_ratio_bt = (seq_log_ratio_b.detach().unsqueeze(-1) + logp_bt - logp_bt.detach()).clamp(max=10.0)
    ratio_bt = log_seq_ratio_bt.exp()
    unclipped_bt = -adv_bt * ratio_bt
    clipped_bt = -adv_bt * ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_bt = torch.maximum(unclipped_bt, clipped_bt)
    return PolicyLossOut(
        loss_bt, ratio_bt, (clipped_bt > unclipped_bt).float(), -log_ratio_bt, torch.zeros_like(loss_bt)
    )


def nll_loss(logp_bt: torch.Tensor) -> PolicyLossOut:
    """Supervised fine-tuning's loss (sft.enable): each trained token's negative log-likelihood, L = -log p; no
    ratio (1), nothing clipped. Aggregated as the policy loss is (actor.loss_agg_mode: token-mean is verl's and
    TRL's SFT loss)."""
    zeros = torch.zeros_like(logp_bt)
    return PolicyLossOut(-logp_bt, torch.ones_like(logp_bt), zeros, zeros, zeros)
