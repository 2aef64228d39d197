"""Filters that act on a scored batch where it was generated, before it is shipped: pure functions.

- Compact filtering (rLLM's `compact_filtering`): samples that ended for a flagged termination reason get
  weight 0, so they stay in the batch (groups stay whole, ranks stay in step) but leave every loss and
  denominator.
- Rejection sampling (rLLM's `rejection_sample`, DAPO's dynamic sampling): a group whose rewards are all
  equal carries no GRPO signal (`uniform_groups`); rollout/groups.py drops such a group as it completes and draws
  another, within a budget, after which it keeps one at weight 0.
"""

from __future__ import annotations

import torch

from torchrl_post.config.schema import CompactFilteringConfig
from torchrl_post.types import TERMINATIONS, Batch

# compact_filtering flag -> the termination reason it masks
COMPACT_FLAGS = {
    "mask_max_prompt_length_exceeded": "max_prompt_length",
    "mask_max_response_length_exceeded": "length",
    "mask_max_turns_exceeded": "max_turns",
    "mask_timeout": "timeout",
    "mask_error": "error",
    "mask_env_done": "env_done",
}


def masked_reasons(cfg: CompactFilteringConfig) -> list[str]:
    """The termination reasons compact filtering masks (none when it is off)."""
    return [reason for flag, reason in COMPACT_FLAGS.items() if cfg.enable and getattr(cfg, flag)]


def compact_filter(batch: Batch, reasons: list[str]) -> None:
    """Weight 0 for every sample whose termination is one of `reasons` (in place)."""
    codes = torch.tensor([TERMINATIONS.index(r) for r in reasons], dtype=torch.long)
    hit = torch.isin(batch.termination, codes)
    batch.weights = torch.where(hit, torch.zeros_like(batch.weights), batch.weights)


def uniform_groups(batch: Batch, scores: torch.Tensor | None = None) -> set[int]:
    """Group ids whose samples all have the same score (`scores`, [B]: the batch's own by default)."""
    scores = batch.scores if scores is None else scores
    assert scores is not None
    out = set()
    for g in batch.group_ids.unique().tolist():
        s = scores[batch.group_ids == g]
        if bool((s == s[0]).all()):
            out.add(int(g))
    return out
