"""Per-token logprobs and entropy of the response part of [prompt | response] sequences."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def logits_to_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, V], labels [B, T] -> (log p(label) [B, T], entropy [B, T]), at `temperature`.

    Temperature 0 (greedy) uses the raw logits, as the rollout engine reports them.
    """
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def response_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_width: int,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward the model once; logprob and entropy of each response token, [B, R] each."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    # The token at column P + t is predicted by the logits at column P + t - 1.
    logits = out.logits[:, -response_width - 1 : -1]
    return logits_to_logprobs(logits, input_ids[:, -response_width:], temperature)


def chunks(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most `size` rows covering range(n)."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


@torch.no_grad()
def batched_log_probs(
    model: torch.nn.Module, batch: Any, temperature: float, micro: int, device: torch.device
) -> torch.Tensor:
    """Logprobs of every response token of a RolloutBatch/TrainBatch under `model`, [B, R], on CPU."""
    model.eval()
    width = batch.response_mask.shape[1]
    outs = [
        response_log_probs(
            model,
            batch.input_ids[sl].to(device),
            batch.attention_mask[sl].to(device),
            batch.position_ids[sl].to(device),
            width,
            temperature,
        )[0].cpu()
        for sl in chunks(len(batch), micro)
    ]
    return torch.cat(outs)
