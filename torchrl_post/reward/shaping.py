"""Scores -> training rewards: DAPO's overlong penalty (reward.overlong_buffer), then a clamp (reward.clip).

Applied once per complete training group, where the rollout side makes it a batch (rollout/groups.py), before
compact filtering and rejection sampling read it; validation scores stay the task's. A trajectory's length is its
generated tokens over all its turns (`loss_mask`: observations are not counted); step-wise rows carry their
trajectory's score, so its penalty goes on every row's score and on its last step's own reward.

    expected = max_length - buffer_length
    penalty  = min(-(length - expected) / buffer_length * penalty_factor, 0)      # verl's DAPORewardManager
    reward   = clamp(score + penalty, -clip, clip)                                # ROLL's reward_clip
"""

from __future__ import annotations

import torch

from torchrl_post.config.schema import RewardConfig
from torchrl_post.types import Batch


def overlong_penalty(
    lengths_b: torch.Tensor, max_length: int, buffer_length: int, penalty_factor: float
) -> torch.Tensor:
    """[B] DAPO's soft overlong punishment of responses `lengths_b` tokens long: 0 up to max_length -
    buffer_length, then falling linearly to -penalty_factor at max_length (and on past it).

    >>> overlong_penalty(torch.tensor([80, 90, 100]), 100, 20, 1.0).tolist()
    [0.0, -0.5, -1.0]
    """
    expected = max_length - buffer_length
    exceed_b = lengths_b.to(torch.float32) - expected
    return torch.clamp(-exceed_b / buffer_length * penalty_factor, max=0.0)


def clip_scores(scores_b: torch.Tensor, clip: float) -> torch.Tensor:
    """[B] each score clamped to [-clip, clip].

    >>> clip_scores(torch.tensor([-12.0, 3.0, 15.0]), 10.0).tolist()
    [-10.0, 3.0, 10.0]
    """
    return torch.clamp(scores_b, -clip, clip)


def trajectory_lengths(loss_mask_bt: torch.Tensor, traj_ids_b: torch.Tensor | None) -> torch.Tensor:
    """[B] each row's generated tokens; for step-wise rows (`traj_ids_b` set), their whole trajectory's.

    >>> trajectory_lengths(torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), torch.tensor([0, 0, 1]))
    tensor([3., 3., 3.])
    """
    lengths_b = loss_mask_bt.sum(-1)
    if traj_ids_b is None:
        return lengths_b
    totals = torch.zeros(int(traj_ids_b.max()) + 1, dtype=lengths_b.dtype).index_add_(0, traj_ids_b, lengths_b)
    return totals[traj_ids_b]


def last_steps(traj_ids_b: torch.Tensor, step_ids_b: torch.Tensor) -> torch.Tensor:
    """[B] bool: the row that is its trajectory's last step.

    >>> last_steps(torch.tensor([0, 0, 1, 0]), torch.tensor([0, 1, 0, 2])).tolist()
    [False, False, True, True]
    """
    last = torch.full((int(traj_ids_b.max()) + 1,), -1, dtype=step_ids_b.dtype)
    last = last.scatter_reduce(0, traj_ids_b, step_ids_b, reduce="amax")
    return step_ids_b == last[traj_ids_b]


def shape_scores(batch: Batch, cfg: RewardConfig, max_response_length: int) -> None:
    """A complete training group's scores made its rewards, in place: the overlong penalty added (its value and
    whether it applied in `reward_extra` "overlong_reward" and "overlong", verl's names), then the clamp."""
    assert batch.scores is not None, "the group is scored before it is shaped"
    ob = cfg.overlong_buffer
    if ob.enable:
        lengths_b = trajectory_lengths(batch.loss_mask, batch.traj_ids)
        penalty_b = overlong_penalty(
            lengths_b, ob.max_response_length or max_response_length, ob.len, ob.penalty_factor
        )
        batch.scores = batch.scores + penalty_b
        if batch.step_rewards is not None:
            assert batch.traj_ids is not None and batch.step_ids is not None
            batch.step_rewards = batch.step_rewards + penalty_b * last_steps(batch.traj_ids, batch.step_ids)
        batch.reward_extra["overlong_reward"] = penalty_b
        batch.reward_extra["overlong"] = (penalty_b < 0).to(torch.float32)
    if cfg.clip is not None:
        batch.scores = clip_scores(batch.scores, cfg.clip)
        if batch.step_rewards is not None:
            batch.step_rewards = clip_scores(batch.step_rewards, cfg.clip)
