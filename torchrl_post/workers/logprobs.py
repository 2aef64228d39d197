"""Per-token logprobs and entropy of the response part of [prompt | response] sequences."""

from __future__ import annotations

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
