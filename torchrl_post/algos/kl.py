"""KL estimators against the reference policy, KL shaping of token rewards, and the KL coefficient controllers.

Follows verl's kl_penalty / apply_kl_penalty / AdaptiveKLController (Ziegler et al. 2019) semantics.
"""

from __future__ import annotations

from typing import get_args

import torch

from torchrl_post.config.enums import KLKind

KL_KINDS = get_args(KLKind)
"""verl's names; `kl` is k1, `mse` is k2, `low_var_kl` is k3. The loss and the reward accept every one."""


def kl_penalty(logp_bt: torch.Tensor, ref_logp_bt: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference, with d = logp - ref_logp.

    kl / k1: d.  abs: |d|.  mse / k2: 0.5 d^2.
    low_var_kl / k3 (Schulman's unbiased low-variance estimator): x = clamp(-d, -20, 20);
    kl = clamp(exp(x) - x - 1, -10, 10), which is >= 0 and 0 exactly when logp == ref_logp.
    Differentiable (usable as a loss term); no masking here.
    """
    if kind in ("kl", "k1"):
        return logp_bt - ref_logp_bt
    if kind == "abs":
        return (logp_bt - ref_logp_bt).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logp_bt - ref_logp_bt).square()
    if kind in ("low_var_kl", "k3"):
        log_ratio_bt = (ref_logp_bt - logp_bt).clamp(-20.0, 20.0)
        return (log_ratio_bt.exp() - log_ratio_bt - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {', '.join(KL_KINDS)}")


def apply_kl_in_reward(
    token_rewards_bt: torch.Tensor, kl_bt: torch.Tensor, mask_bt: torch.Tensor, coef: float
) -> tuple[torch.Tensor, float]:
    """KL shaping of the rewards: r'_t = r_t - coef * kl_t * m_t (tokens with m_t = 0 keep their reward).

    Also returns mean_b(sum_t kl_bt m_bt / max(sum_t m_bt, 1)): the batch mean of each sequence's masked-mean KL
    (an empty row counts as 0), the value fed to AdaptiveKLController.update and logged as actor/reward_kl_penalty.
    """
    mask = mask_bt.to(kl_bt.dtype)
    kl_masked_bt = kl_bt * mask
    new_rewards_bt = token_rewards_bt - coef * kl_masked_bt
    seq_kl_b = kl_masked_bt.sum(-1) / mask.sum(-1).clamp(min=1)
    mean_kl = float(seq_kl_b.mean().item()) if seq_kl_b.numel() else 0.0
    return new_rewards_bt, mean_kl


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, as in verl).

    update: e = clip(current_kl / target_kl - 1, -0.2, 0.2); value *= 1 + e * n_steps / horizon.
    """

    def __init__(self, init_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class FixedKLController:
    """Constant KL coefficient; update is a no-op (same interface as AdaptiveKLController)."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
