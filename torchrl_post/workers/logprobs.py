"""Per-token logprobs and entropy of the response part of [prompt | response] sequences."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from torchrl_post.multimodal.vision import NEVER_GENERATED_BIAS, VisionSpec, model_inputs
from torchrl_post.types import Batch


def logits_to_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, never: tuple[int, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, V], labels [B, T] -> (log p(label) [B, T], entropy [B, T]), at `temperature`.

    Temperature 0 (greedy) uses the raw logits, as the rollout engine reports them. `never`: token ids whose
    logits get NEVER_GENERATED_BIAS first, as the engines bias them (a vision model's placeholders).
    """
    logits = logits.float()
    if never:
        logits = logits.clone()
        logits[..., list(never)] += NEVER_GENERATED_BIAS
    if temperature > 0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def response_log_probs(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], response_width: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward the model once on `inputs` (`model_inputs`); logprob and entropy of each response token, [B, R]."""
    out = model(**inputs, use_cache=False)
    # The token at column P + t is predicted by the logits at column P + t - 1.
    logits = out.logits[:, -response_width - 1 : -1]
    spec = VisionSpec.of(getattr(model, "config", None))
    never = spec.never_generated if spec is not None else ()
    return logits_to_logprobs(logits, inputs["input_ids"][:, -response_width:], temperature, never)


def chunks(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most `size` rows covering range(n)."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


@torch.no_grad()
def batched_log_probs(
    model: torch.nn.Module, batch: Batch, temperature: float, micro: int, device: torch.device, token_budget: int = 0
) -> torch.Tensor:
    """Logprobs of every response token of a Batch under `model`, [B, R], on CPU."""
    model.eval()
    width = batch.response_mask.shape[1]
    outs = [
        padded_forward_log_probs(model, batch, sl, temperature, device)[0].cpu()
        for sl in micro_slices(batch.attention_mask, width, micro, token_budget)
    ]
    return torch.cat(outs)


def trim_span(attention_mask: torch.Tensor, response_width: int) -> tuple[int, int]:
    """(first column, response columns kept) after dropping padding shared by every row of a micro-batch.

    Prompts are left-padded and responses right-padded, so the columns before the earliest prompt token and
    after the longest response carry nothing. At least one response column is kept.
    """
    prompt_width = attention_mask.shape[1] - response_width
    real_cols = attention_mask.any(0).nonzero()
    first = int(real_cols[0].item()) if len(real_cols) else 0
    last = int(real_cols[-1].item()) if len(real_cols) else prompt_width
    return min(first, prompt_width - 1), max(1, last + 1 - prompt_width)


def micro_slices(attention_mask: torch.Tensor, response_width: int, max_rows: int, token_budget: int) -> list[slice]:
    """Contiguous micro-batches of at most `max_rows` rows, or, with `token_budget` > 0 (dynamic batch size),
    as many rows as fit rows x trimmed width <= token_budget (at least one row each)."""
    n = attention_mask.shape[0]
    if token_budget <= 0:
        return list(chunks(n, max_rows))
    prompt_width = attention_mask.shape[1] - response_width
    firsts = torch.where(attention_mask.any(1), attention_mask.float().argmax(1), prompt_width - 1)
    lasts = attention_mask.shape[1] - 1 - attention_mask.flip(1).float().argmax(1)
    out: list[slice] = []
    start, lo, hi = 0, 0, 0
    for i in range(n):
        f, last = int(firsts[i]), max(int(lasts[i]), prompt_width)
        if i == start:
            lo, hi = f, last
        elif (i - start + 1) * (max(hi, last) - min(lo, f) + 1) > token_budget:
            out.append(slice(start, i))
            start, lo, hi = i, f, last
        else:
            lo, hi = min(lo, f), max(hi, last)
    if start < n:
        out.append(slice(start, n))
    return out


def padded_forward_log_probs(
    model: torch.nn.Module, batch: Batch, rows: slice, temperature: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """response_log_probs of `rows` on their trimmed span, padded back to [b, R]; also the cells computed."""
    width = batch.response_width
    mask = batch.attention_mask[rows]
    first, kept = trim_span(mask, width)
    end = mask.shape[1] - width + kept
    logp, ent = response_log_probs(model, model_inputs(batch, rows, first, end, device), kept, temperature)
    pad = width - kept
    if pad:
        logp = torch.nn.functional.pad(logp, (0, pad))
        ent = torch.nn.functional.pad(ent, (0, pad))
    return logp, ent, mask.shape[0] * (end - first)
