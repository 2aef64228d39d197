"""Reward functions (verl signature) and batch scoring with error counting."""

from torchrl_post.reward.scoring import (
    RewardFn,
    Scores,
    check_reward_signature,
    resolve_reward_fn,
    reward_for_sources,
    score_batch,
)

__all__ = ["RewardFn", "Scores", "check_reward_signature", "resolve_reward_fn", "reward_for_sources", "score_batch"]
