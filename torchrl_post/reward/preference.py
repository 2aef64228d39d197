"""Pairwise preference math for reward models: the Bradley-Terry loss and pairwise accuracy.

A reward model r scores a chosen and a rejected response to the same prompt; Bradley-Terry models
P(chosen preferred) = sigmoid(r_chosen - r_rejected), so its negative log-likelihood is

    loss = mean over pairs of -log sigmoid(r_chosen - r_rejected - margin)

(the margin, as in Llama 2's reward models, asks a pair to be separated by at least that much). Pure tensor
functions over [P] scores of P pairs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen_p: torch.Tensor, rejected_p: torch.Tensor, margin_p: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean of -logsigmoid(chosen - rejected - margin) over the pairs (margin: 0 when None).

    >>> round(bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0])).item(), 4)  # log(1 + e^-1)
    0.3133
    """
    diff_p = chosen_p - rejected_p
    if margin_p is not None:
        diff_p = diff_p - margin_p
    return -F.logsigmoid(diff_p).mean()


def pairwise_accuracy(chosen_p: torch.Tensor, rejected_p: torch.Tensor) -> torch.Tensor:
    """The share of pairs whose chosen response scores strictly above the rejected one (a tie counts as wrong)."""
    return (chosen_p > rejected_p).float().mean()
