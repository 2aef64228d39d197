"""Step-wise advantages for agent trajectories trained step by step (each turn its own sample).

Every row of a step-wise batch is one step of one trajectory: `traj_ids` name the trajectory (negative: a
padding row), `step_ids` the step's index in it, `group_ids` the task the trajectory belongs to.

- broadcast: the trajectory's outcome advantage (grpo / rloo over the trajectories of its group) on every step's
  own response tokens; `normalize_by_steps` divides it by the trajectory's number of steps.
- per_step: each step's return (the discounted sum of its own and later step rewards) normalised against the
  same step index of the group's other trajectories (groups of variable size: trajectories end at
  different turns).

All functions are pure tensor functions; the result is a per-row scalar that `step_advantages` puts on the
row's own loss mask (never another step's).
"""

from __future__ import annotations

import torch

from torchrl_post.algos.advantages import group_advantages


def step_returns(
    rewards_b: torch.Tensor, traj_b: torch.Tensor, step_b: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """[B] Monte-Carlo return of each step: its reward plus the discounted returns of its trajectory's later
    steps (rows of one trajectory may come in any order)."""
    out = torch.zeros(rewards_b.shape[0], dtype=torch.float32)
    for t in traj_b.unique().tolist():
        idx = (traj_b == t).nonzero().flatten()
        idx = idx[step_b[idx].argsort()]
        acc = 0.0
        for i in reversed(idx.tolist()):
            acc = float(rewards_b[i]) + gamma * acc
            out[i] = acc
    return out


def broadcast_advantages(
    scores_b: torch.Tensor,
    group_b: torch.Tensor,
    traj_b: torch.Tensor,
    estimator: str,
    norm_by_std: bool = True,
    normalize_by_steps: bool = False,
) -> torch.Tensor:
    """[B]: each row gets its trajectory's advantage, computed over the trajectories of its group (one score
    per trajectory, however many steps it has); divided by the step count with `normalize_by_steps`.
    Padding rows (traj < 0) get 0."""
    out = torch.zeros(scores_b.shape[0], dtype=torch.float32)
    real = (traj_b >= 0).nonzero().flatten()
    if len(real) == 0:
        return out
    trajs, first, counts = _firsts(traj_b[real])
    rows = real[first]
    traj_adv = group_advantages(scores_b[rows], group_b[rows], estimator, norm_by_std)
    per_row = traj_adv[torch.searchsorted(trajs, traj_b[real])]
    if normalize_by_steps:
        per_row = per_row / counts[torch.searchsorted(trajs, traj_b[real])].float()
    out[real] = per_row
    return out


def per_step_advantages(
    rewards_b: torch.Tensor,
    group_b: torch.Tensor,
    traj_b: torch.Tensor,
    step_b: torch.Tensor,
    estimator: str,
    norm_by_std: bool = True,
    gamma: float = 1.0,
) -> torch.Tensor:
    """[B]: each step's return normalised within (group, step index). Padding rows (traj < 0) get 0."""
    out = torch.zeros(rewards_b.shape[0], dtype=torch.float32)
    real = (traj_b >= 0).nonzero().flatten()
    if len(real) == 0:
        return out
    returns = step_returns(rewards_b[real], traj_b[real], step_b[real], gamma)
    width = int(step_b[real].max()) + 1
    keys = group_b[real] * width + step_b[real]
    out[real] = group_advantages(returns, keys, estimator, norm_by_std)
    return out


def _firsts(traj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted unique trajectory ids, index of each one's first row, each one's row count)."""
    trajs, inverse, counts = traj.unique(return_inverse=True, return_counts=True)
    first = torch.full((len(trajs),), len(traj), dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(len(traj)), reduce="amin")
    return trajs, first, counts
