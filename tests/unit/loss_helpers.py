"""A ragged mini-batch (logprobs, advantages, masks) shared by the loss-aggregation and micro-batch tests."""

from __future__ import annotations

import torch

R = 8  # padded response width
L = 10  # data.max_response_length (deliberately not R)
P = 6  # padded prompt width
RESP_LENS = [8, 3, 5, 1, 7, 0, 6, 4, 8, 5, 3, 6]  # row 5 is filtered (all-zero mask)
PROMPT_LENS = [2, 6, 1, 4, 3, 5, 6, 1, 2, 3, 6, 4]
N = len(RESP_LENS)


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp leaf [N, R], adv [N, R], mask [N, R] right-padded, attention [N, P + R] left/right-padded)."""
    g = torch.Generator().manual_seed(1234)
    logp = (-torch.rand(N, R, generator=g, dtype=torch.float64) * 3).requires_grad_()
    adv = torch.randn(N, R, generator=g, dtype=torch.float64)
    cols = torch.arange(R)
    mask = (cols.unsqueeze(0) < torch.tensor(RESP_LENS).unsqueeze(1)).double()
    prompt = (torch.arange(P).unsqueeze(0) >= P - torch.tensor(PROMPT_LENS).unsqueeze(1)).long()
    attention = torch.cat([prompt, mask.long()], dim=1)
    return logp, adv, mask, attention
