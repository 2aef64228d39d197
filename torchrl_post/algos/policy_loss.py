"""PPO clipped surrogate and loss aggregation (verl's loss_agg_mode names)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def agg_loss(loss_bt: torch.Tensor, mask_bt: torch.Tensor, mode: str, token_norm: float | None = None) -> torch.Tensor:
    """Reduce token losses [B, T] to a scalar.

    token-mean: sum over all tokens / number of tokens (or / token_norm when given: the global count
    across ranks and micro-batches, which makes gradient accumulation exact).
    seq-mean-token-sum: mean over sequences of each sequence's token sum.
    seq-mean-token-mean: mean over sequences of each sequence's token mean.
    seq-mean-token-sum-norm: total token sum / T (the padded width; Dr.GRPO's constant normaliser).
    """
    if mode == "token-mean":
        denom = token_norm if token_norm is not None else mask_bt.sum().clamp(min=1)
        return (loss_bt * mask_bt).sum() / denom
    seq_sum_b = (loss_bt * mask_bt).sum(-1)
    if mode == "seq-mean-token-sum":
        return seq_sum_b.mean()
    if mode == "seq-mean-token-mean":
        return (seq_sum_b / mask_bt.sum(-1).clamp(min=1)).mean()
    if mode == "seq-mean-token-sum-norm":
        return seq_sum_b.sum() / loss_bt.shape[-1]
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


@dataclass
class PolicyLossOut:
    loss_bt: torch.Tensor  # per-token loss, before aggregation
    ratio_bt: torch.Tensor
    clipped_bt: torch.Tensor  # 1.0 where the clipped branch was taken
    approx_kl_bt: torch.Tensor  # old_logp - logp (k1), for actor/ppo_kl


def ppo_clip_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> PolicyLossOut:
    """Token-level PPO clipped surrogate: max(-A r, -A clip(r, 1 - low, 1 + high))."""
    log_ratio_bt = (logp_bt - old_logp_bt).clamp(-20.0, 20.0)
    ratio_bt = log_ratio_bt.exp()
    unclipped_bt = -adv_bt * ratio_bt
    clipped_bt = -adv_bt * ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_bt = torch.maximum(unclipped_bt, clipped_bt)
    return PolicyLossOut(loss_bt, ratio_bt, (clipped_bt > unclipped_bt).float(), -log_ratio_bt)
