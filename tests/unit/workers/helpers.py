"""Batches for the workers' tests: ragged rows of known prompt and response lengths."""

from __future__ import annotations

import torch

from torchrl_post.types import Batch

CPU = torch.device("cpu")


def _batch(rows: list[tuple[int, int]], prompt: int = 7, resp: int = 5, seed: int = 0) -> Batch:
    """Rows with (left prompt padding, right response padding) as given."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (len(rows), prompt + resp), generator=gen)
    attn = torch.ones_like(ids)
    for i, (lp, lr) in enumerate(rows):
        attn[i, :lp] = 0
        if lr:
            attn[i, prompt + resp - lr :] = 0
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        loss_mask=attn[:, prompt:].float(),
        rollout_log_probs=torch.zeros(len(rows), resp),
        group_ids=torch.arange(len(rows)),
        termination=torch.zeros(len(rows), dtype=torch.long),
        weights=torch.ones(len(rows)),
    )


RAGGED = [(0, 0), (3, 1), (1, 4), (5, 2), (2, 5), (0, 5)]  # the last two: empty responses


def _groups(prompt_pads: list[int], resp_pads: list[list[int]], prompt: int = 9, resp: int = 4) -> Batch:
    """GRPO-like rows: group g's samples share one prompt (left padding `prompt_pads[g]`), their responses
    right-padded by `resp_pads[g]`."""
    rows = [(lp, lr) for lp, pads in zip(prompt_pads, resp_pads, strict=True) for lr in pads]
    b = _batch(rows, prompt=prompt, resp=resp, seed=3)
    start = 0
    for pads in resp_pads:
        b.input_ids[start : start + len(pads), :prompt] = b.input_ids[start, :prompt]
        start += len(pads)
    return b
