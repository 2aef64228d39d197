"""Advantage estimator dispatch: scores (and values, KL-shaped token rewards) -> advantages and returns."""

from __future__ import annotations

import torch

from torchrl_post.algos.advantages import (
    gae_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    reinforce_returns,
    rloo_advantages,
)
from torchrl_post.config.schema import AlgorithmConfig

NEEDS_VALUES = ("gae",)
GROUPED = ("grpo", "rloo")


def compute_advantages(
    cfg: AlgorithmConfig,
    scores_b: torch.Tensor,
    token_rewards_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    n: int,
    values_bt: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]).

    Outcome estimators (grpo, rloo) use the sequence scores; token-level ones (gae, reinforce,
    reinforce_plus_plus) use `token_rewards_bt` (the score on the last token, minus any KL penalty).
    For outcome estimators the returns are the advantages (there is no critic to regress onto them).
    """
    est = cfg.adv_estimator
    if est == "grpo":
        adv = grpo_advantages(scores_b, n, mask_bt, cfg.norm_adv_by_std_in_grpo)
        return adv, adv
    if est == "rloo":
        adv = rloo_advantages(scores_b, n, mask_bt)
        return adv, adv
    if est == "gae":
        assert values_bt is not None, "placement resolves a critic for gae"
        return gae_advantages(token_rewards_bt, values_bt, mask_bt, cfg.gamma, cfg.lam)
    if est == "reinforce":
        returns = reinforce_returns(token_rewards_bt, mask_bt, cfg.gamma)
        return returns, returns
    if est == "reinforce_plus_plus":
        return reinforce_plus_plus_advantages(token_rewards_bt, mask_bt, cfg.gamma)
    raise ValueError(f"unknown adv_estimator {est!r}")
