"""Advantage estimators: GRPO, RLOO, GAE, REINFORCE and REINFORCE++ (verl's definitions), plus reward placement.

Groups keep a [num_prompts, n] layout so group statistics are one vectorised op. Token tensors are [B, T] with
right-padded responses; mask_bt is 1.0 on real response tokens. Outputs are float32 and zero on masked tokens.
"""

from __future__ import annotations

import math
from typing import get_args

import torch

from torchrl_post.algos.policy_loss import masked_mean
from torchrl_post.config.enums import GroupEstimator

GROUP_ESTIMATORS = get_args(GroupEstimator)


def group_advantages(
    scores_b: torch.Tensor, group_ids_b: torch.Tensor, estimator: str, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """[B] outcome advantages within the groups of rows sharing a group id (any size; a group of one gets 0).

    grpo: (r - group mean) / (group std + eps), the unbiased std as verl (or mean-centred only);
    rloo: r - mean of the group's others = n / (n - 1) * (r - group mean).
    The usual layout (equal groups of adjacent rows, prompt-major) is one [G, n] vectorised op.
    """
    if estimator not in GROUP_ESTIMATORS:
        raise ValueError(f"group advantages support {', '.join(GROUP_ESTIMATORS)}, not {estimator!r}")
    scores = scores_b.float()
    ids, counts = torch.unique_consecutive(group_ids_b, return_counts=True)
    n = int(counts[0]) if len(counts) else 0
    if n > 1 and bool((counts == n).all()) and len(ids.unique()) == len(ids):
        return _group_formula(scores.view(-1, n), estimator, norm_by_std, eps).reshape(-1)
    out = torch.zeros(scores.shape[0], dtype=torch.float32)
    for key in group_ids_b.unique().tolist():
        idx = (group_ids_b == key).nonzero().flatten()
        if len(idx) > 1:
            out[idx] = _group_formula(scores[idx].view(1, -1), estimator, norm_by_std, eps).reshape(-1)
    return out


def _group_formula(groups_gn: torch.Tensor, estimator: str, norm_by_std: bool, eps: float) -> torch.Tensor:
    n = groups_gn.shape[1]
    centered_gn = groups_gn - groups_gn.mean(dim=1, keepdim=True)
    if estimator == "rloo":
        return centered_gn * (n / (n - 1))
    if norm_by_std:
        centered_gn = centered_gn / (groups_gn.std(dim=1, keepdim=True) + eps)
    return centered_gn


def grpo_advantages(
    scores_b: torch.Tensor, group_ids_b: torch.Tensor, response_mask_bt: torch.Tensor, norm_by_std: bool = True
) -> torch.Tensor:
    """GRPO outcome advantages (`group_advantages`), broadcast to every response token: [B, T], zero on masked
    tokens."""
    return group_advantages(scores_b, group_ids_b, "grpo", norm_by_std).unsqueeze(-1) * response_mask_bt


def masked_whiten(x_bt: torch.Tensor, mask_bt: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whiten over the masked entries of the whole batch (verl's masked_whiten with shift_mean=True).

    mu = sum(m x) / sum(m); var = sum(m (x - mu)^2) / sum(m) * N / (N - 1) with N = sum(m) (unbiased);
    out = (x - mu) / sqrt(var + eps). Not re-masked: callers multiply by the mask. verl raises when N <= 1;
    here N = 1 gives the Bessel factor 1 (the single entry whitens to 0) and N = 0 gives mu = 0, var = 0.
    """
    mask = mask_bt.to(x_bt.dtype)
    mean = masked_mean(x_bt, mask)
    count = mask.sum()
    var = masked_mean((x_bt - mean) ** 2, mask) * count / (count - 1).clamp(min=1)
    return (x_bt - mean) * torch.rsqrt(var + eps)


def whiten_moments(x_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """[3] float64 on the CPU: (N, sum x, sum x^2) over the entries where mask_bt != 0. Moments of disjoint
    parts of a batch (data-parallel ranks' rows) add up to the whole batch's, for `whiten_by_moments`."""
    x = x_bt.double()[mask_bt != 0]
    return torch.tensor([float(x.numel()), x.sum().item(), (x * x).sum().item()], dtype=torch.float64)


def whiten_by_moments(
    x_bt: torch.Tensor, mask_bt: torch.Tensor, moments_3: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """`masked_whiten` with the mean and variance of `moments_3` (`whiten_moments`, summed over the parts of the
    batch): mu = S / N; var = (Q - N mu^2) / (N - 1) (unbiased; N <= 1: 0); out = (x - mu) / sqrt(var + eps) on the
    entries where mask_bt != 0, 0 elsewhere (float32)."""
    n, total, squares = moments_3.tolist()
    mean = total / n if n > 0 else 0.0
    var = max(squares - n * mean * mean, 0.0) / max(n - 1.0, 1.0)
    out_bt = (x_bt.double() - mean) / math.sqrt(var + eps)
    return (out_bt * (mask_bt != 0)).float()


def clip_advantages(adv_bt: torch.Tensor, mask_bt: torch.Tensor, clip: float) -> tuple[torch.Tensor, float]:
    """(adv clamped to [-clip, clip], the fraction of the entries where mask_bt != 0 that the clamp changed;
    0.0 without such entries)."""
    valid_bt = mask_bt != 0
    changed = int(((adv_bt.abs() > clip) & valid_bt).sum())
    return adv_bt.clamp(-clip, clip), changed / max(int(valid_bt.sum()), 1)


def gae_advantages(
    token_rewards_bt: torch.Tensor,
    values_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over the response tokens, right to left (verl's compute_gae_advantage_return).

    V'_{t+1} = V_{t+1} m_{t+1} (0 past the last real token); delta_t = r_t + gamma V'_{t+1} - V_t;
    A_t = (delta_t + gamma lam A_{t+1}) m_t; returns R_t = (A_t + V_t) m_t (not whitened);
    advantages = masked_whiten(A) m over the rows given (unbiased var, eps 1e-8), or A m when not `whiten` (the
    caller whitens over more rows: algorithm.whiten_advantages). Returns (adv_bt, returns_bt).
    """
    rewards_bt = token_rewards_bt.float()
    values_f_bt = values_bt.float()
    mask = mask_bt.float()
    width = rewards_bt.shape[-1]
    adv_raw_bt = torch.zeros_like(rewards_bt)
    next_value_b = torch.zeros_like(rewards_bt[:, 0])
    next_adv_b = torch.zeros_like(rewards_bt[:, 0])
    for t in reversed(range(width)):
        delta_b = rewards_bt[:, t] + gamma * next_value_b - values_f_bt[:, t]
        next_adv_b = (delta_b + gamma * lam * next_adv_b) * mask[:, t]
        adv_raw_bt[:, t] = next_adv_b
        next_value_b = values_f_bt[:, t] * mask[:, t]
    returns_bt = (adv_raw_bt + values_f_bt) * mask
    adv_bt = masked_whiten(adv_raw_bt, mask) * mask if whiten else adv_raw_bt
    return adv_bt, returns_bt


def reinforce_returns(token_rewards_bt: torch.Tensor, mask_bt: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return-to-go per response token (plain REINFORCE: no baseline, no whitening).

    G_t = (r_t + gamma G_{t+1}) m_t with G_T = 0, so a sequence's sum stops at its last real token.
    Returns [B, T], zero on masked tokens.
    """
    rewards_bt = token_rewards_bt.float()
    mask = mask_bt.float()
    returns_bt = torch.zeros_like(rewards_bt)
    running_b = torch.zeros_like(rewards_bt[:, 0])
    for t in reversed(range(rewards_bt.shape[-1])):
        running_b = (rewards_bt[:, t] + gamma * running_b) * mask[:, t]
        returns_bt[:, t] = running_b
    return returns_bt


def reinforce_plus_plus_advantages(
    token_rewards_bt: torch.Tensor, mask_bt: torch.Tensor, gamma: float, whiten: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (verl's reinforce_plus_plus): G = return-to-go as in reinforce_returns; A = masked_whiten(G) m.

    The token rewards should already carry the KL shaping (apply_kl_in_reward). The whitening is over the
    rows given (unbiased var, eps 1e-8, mean shifted to 0); not `whiten`: A = G (the caller whitens over more
    rows). Returns (adv_bt, returns_bt), zero on masked tokens.
    """
    returns_bt = reinforce_returns(token_rewards_bt, mask_bt, gamma)
    mask = mask_bt.float()
    return (masked_whiten(returns_bt, mask) * mask if whiten else returns_bt), returns_bt


def rloo_advantages(scores_b: torch.Tensor, group_ids_b: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """RLOO: A_i = r_i - mean_{j != i} r_j within each group (`group_advantages`), broadcast to the response
    tokens: [B, T], zero on masked tokens."""
    return group_advantages(scores_b, group_ids_b, "rloo").unsqueeze(-1) * mask_bt.float()


def scores_to_token_rewards(scores_b: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Outcome reward placement: token_rewards[b, t] = score_b if t is row b's last real token, else 0.

    A row with no real token gets nothing. Returns float32 [B, T].
    """
    rewards_bt = torch.zeros(mask_bt.shape, dtype=torch.float32, device=mask_bt.device)
    if mask_bt.shape[-1] == 0:
        return rewards_bt
    positions_t = torch.arange(mask_bt.shape[-1], device=mask_bt.device)
    last_b = torch.where(mask_bt > 0, positions_t, -1).amax(dim=-1)
    rows_b = (last_b >= 0).nonzero().squeeze(-1)
    rewards_bt[rows_b, last_b[rows_b]] = scores_b.float().to(mask_bt.device)[rows_b]
    return rewards_bt


def informative_rows(adv_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Indices of the rows with a nonzero advantage on some trained token: the others' policy-loss terms and their
    gradients are exactly 0 (whatever the ratio, clipping or aggregation), so the update may skip them."""
    return ((adv_bt != 0) & (mask_bt != 0)).any(-1).nonzero().flatten()
