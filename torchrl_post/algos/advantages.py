"""Advantage estimators. Groups keep a [num_prompts, n] layout so group statistics are one vectorised op."""

from __future__ import annotations

import torch


def grpo_advantages(
    scores_b: torch.Tensor, n: int, response_mask_bt: torch.Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantages: (score - group mean) / (group std + eps), broadcast to every response token.

    scores_b: [B] with B = num_prompts * n, prompt-major (the n samples of a prompt are adjacent).
    Uses the unbiased std, as verl does. Returns [B, T], zero on masked tokens.
    """
    groups_gn = scores_b.float().view(-1, n)
    centered_gn = groups_gn - groups_gn.mean(dim=1, keepdim=True)
    if norm_by_std:
        centered_gn = centered_gn / (groups_gn.std(dim=1, keepdim=True) + eps)
    return centered_gn.reshape(-1, 1) * response_mask_bt
