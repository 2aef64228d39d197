"""PPO critic loss: the clipped value loss (verl's compute_value_loss)."""

from __future__ import annotations

import torch

from torchrl_post.algos.policy_loss import LossScale, agg_loss, masked_mean


def clipped_value_loss(
    values_bt: torch.Tensor,
    old_values_bt: torch.Tensor,
    returns_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str,
    scale: LossScale | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss; returns (loss, clipfrac).

    v_clip = V_old + clamp(V - V_old, -c, c); loss_bt = 0.5 * max((V - R)^2, (v_clip - R)^2);
    loss = agg_loss(loss_bt, mask_bt, loss_agg_mode, scale) (the micro-batch's share); clipfrac = masked mean of
    [(v_clip - R)^2 > (V - R)^2], the fraction of tokens where the clipped term was taken. `cliprange_value` None:
    no clipping (ROLL's value_clip None), loss_bt = 0.5 * (V - R)^2 and clipfrac 0.
    """
    if cliprange_value is None:
        clipped_values_bt = values_bt
    else:
        clipped_values_bt = old_values_bt + (values_bt - old_values_bt).clamp(-cliprange_value, cliprange_value)
    unclipped_sq_bt = (values_bt - returns_bt).square()
    clipped_sq_bt = (clipped_values_bt - returns_bt).square()
    loss_bt = 0.5 * torch.maximum(unclipped_sq_bt, clipped_sq_bt)
    loss = agg_loss(loss_bt, mask_bt, loss_agg_mode, scale)
    clipfrac = masked_mean((clipped_sq_bt > unclipped_sq_bt).to(loss_bt.dtype), mask_bt.to(loss_bt.dtype))
    return loss, clipfrac.detach()
