"""Advantage estimator dispatch: a scored batch (and its values, KL-shaped token rewards) -> advantages, returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, get_args

import torch

from torchrl_post.algos.advantages import (
    GROUP_ESTIMATORS,
    clip_advantages,
    gae_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    reinforce_returns,
    rloo_advantages,
    scores_to_token_rewards,
    whiten_by_moments,
    whiten_moments,
)
from torchrl_post.algos.kl import apply_kl_in_reward, kl_penalty
from torchrl_post.algos.stepwise import broadcast_advantages, per_step_advantages
from torchrl_post.config.enums import AdvEstimator
from torchrl_post.types import Batch

if TYPE_CHECKING:
    from torchrl_post.config.schema import AlgorithmConfig

ADV_ESTIMATORS = get_args(AdvEstimator)  # compute_advantages dispatches on each
NEEDS_VALUES = ("gae",)
GROUPED = GROUP_ESTIMATORS

SumOverRanks = Callable[[torch.Tensor], torch.Tensor]
"""A small CPU tensor -> its sum over the actor's data-parallel ranks (the identity on one rank)."""


def compute_advantages(
    cfg: AlgorithmConfig,
    scores_b: torch.Tensor,
    token_rewards_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    group_ids_b: torch.Tensor,
    values_bt: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]).

    Outcome estimators (grpo, rloo) use the sequence scores within the groups of `group_ids_b`; token-level ones (gae, reinforce,
    reinforce_plus_plus) use `token_rewards_bt` (the score on the last token, minus any KL penalty).
    For outcome estimators the returns are the advantages (there is no critic to regress onto them).
    gae and reinforce_plus_plus whiten over these rows unless algorithm.whiten_advantages whitens over all ranks'.
    """
    est = cfg.adv_estimator
    if est == "grpo":
        adv = grpo_advantages(scores_b, group_ids_b, mask_bt, cfg.norm_adv_by_std_in_grpo)
        return adv, adv
    if est == "rloo":
        adv = rloo_advantages(scores_b, group_ids_b, mask_bt)
        return adv, adv
    if est == "gae":
        assert values_bt is not None, "placement resolves a critic for gae"
        return gae_advantages(token_rewards_bt, values_bt, mask_bt, cfg.gamma, cfg.lam, not cfg.whiten_advantages)
    if est == "reinforce":
        returns = reinforce_returns(token_rewards_bt, mask_bt, cfg.gamma)
        return returns, returns
    if est == "reinforce_plus_plus":
        return reinforce_plus_plus_advantages(token_rewards_bt, mask_bt, cfg.gamma, not cfg.whiten_advantages)
    raise ValueError(f"unknown adv_estimator {est!r}; expected one of {', '.join(ADV_ESTIMATORS)}")


def estimate_advantages(
    cfg: AlgorithmConfig, batch: Batch, kl_coef: float, sum_over_ranks: SumOverRanks | None = None
) -> dict[str, tuple[str, float]]:
    """Fill `batch.advantages` and `batch.returns` (the KL penalty, if on, shapes the token rewards first), then
    whiten and clip the advantages (`normalize_advantages`). Every actor rank calls it: `sum_over_ranks`
    (None: one rank) sums the whitening's moments over them.

    Returns this rank's metrics as {name: (reduce op, value)} for `logging.reduce.reduce_metrics`; the
    adaptive KL controller is updated by the caller with the reduced `actor/reward_kl_penalty`.
    """
    local = _estimate(cfg, batch, kl_coef)
    return local | normalize_advantages(cfg, batch, sum_over_ranks or (lambda t: t))


def normalize_advantages(
    cfg: AlgorithmConfig, batch: Batch, sum_over_ranks: SumOverRanks
) -> dict[str, tuple[str, float]]:
    """algorithm.whiten_advantages over the trained tokens (loss_mask * weight != 0) of every rank's rows, then
    algorithm.advantage_clip; the returns stay as estimated. Metrics: critic/advantage_clip_frac (with a clip)."""
    assert batch.advantages is not None
    mask = batch.train_mask
    if cfg.whiten_advantages:
        moments = sum_over_ranks(whiten_moments(batch.advantages, mask))
        batch.advantages = whiten_by_moments(batch.advantages, mask, moments)
    if cfg.advantage_clip is None:
        return {}
    batch.advantages, frac = clip_advantages(batch.advantages, mask, cfg.advantage_clip)
    return {"critic/advantage_clip_frac": ("mean", frac)}


def _estimate(cfg: AlgorithmConfig, batch: Batch, kl_coef: float) -> dict[str, tuple[str, float]]:
    """The estimator alone (`estimate_advantages`)."""
    assert batch.scores is not None, "the rollout source scores every batch"
    if batch.traj_ids is not None:  # a step-wise batch (algorithm.stepwise_advantage)
        return _stepwise(cfg, batch)
    mask = batch.loss_mask
    token_rewards = scores_to_token_rewards(batch.scores, mask)
    local: dict[str, tuple[str, float]] = {}
    if cfg.use_kl_in_reward:
        assert batch.old_log_probs is not None and batch.ref_log_probs is not None
        kl_bt = kl_penalty(batch.old_log_probs, batch.ref_log_probs, cfg.kl_penalty)
        token_rewards, kl_mean = apply_kl_in_reward(token_rewards, kl_bt, mask, kl_coef)
        local["actor/reward_kl_penalty"] = ("mean", kl_mean)
    batch.advantages, batch.returns = compute_advantages(
        cfg, batch.scores, token_rewards, mask, batch.group_ids, batch.values
    )
    tokens = max(mask.sum().item(), 1.0)
    if batch.values is not None:
        local["critic/values/mean"] = ("mean", (batch.values * mask).sum().item() / tokens)
    if cfg.adv_estimator not in GROUPED:
        local["critic/returns/mean"] = ("mean", (batch.returns * mask).sum().item() / tokens)
    return local


def _stepwise(cfg: AlgorithmConfig, batch: Batch) -> dict[str, tuple[str, float]]:
    """Each row is one step of an agent trajectory: a per-row advantage on the row's own response tokens."""
    sw = cfg.stepwise_advantage
    assert batch.traj_ids is not None and batch.step_ids is not None and batch.scores is not None
    if sw.mode == "per_step":
        assert batch.step_rewards is not None, "step-wise batches carry their step rewards"
        adv_b = per_step_advantages(
            batch.step_rewards,
            batch.group_ids,
            batch.traj_ids,
            batch.step_ids,
            cfg.adv_estimator,
            cfg.norm_adv_by_std_in_grpo,
            cfg.gamma,
        )
    else:
        adv_b = broadcast_advantages(
            batch.scores,
            batch.group_ids,
            batch.traj_ids,
            cfg.adv_estimator,
            cfg.norm_adv_by_std_in_grpo,
            sw.normalize_by_steps,
        )
    batch.advantages = adv_b.unsqueeze(-1) * batch.loss_mask
    batch.returns = batch.advantages
    return {}
