"""Several reward sources -> one training score per sample (reward.weights, reward.combine).

    sum_then_normalize   score = sum_s w_s * r_s                          (TRL's reward_weights; the estimator
                                                                          then normalises within the group)
    normalize_then_sum   score = sum_s w_s * (r_s - mean_g(r_s)) / (std_g(r_s) + eps)     (GDPO)

mean_g and std_g are over the samples of the sample's own group (its prompt), std unbiased as GRPO's; a group of
one sample, or a source constant within a group, contributes 0 there. Sources are `rule` (the rule function's
score) and `reward_model`; their raw means are logged as reward/<source>/mean.
"""

from __future__ import annotations

import math

import torch

from torchrl_post.config.schema import RewardConfig
from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.reward.shaping import shape_scores
from torchrl_post.types import Batch

EPS = 1e-6


def group_standardized(scores_b: torch.Tensor, group_ids_b: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """[B] each score minus its group's mean, over its group's unbiased std + eps (0 for a group of one).

    >>> group_standardized(torch.tensor([1.0, 3.0, 5.0, 5.0]), torch.tensor([0, 0, 1, 1])).tolist()
    [-0.7071062922477722, 0.7071062922477722, 0.0, 0.0]
    """
    out = torch.zeros_like(scores_b, dtype=torch.float32)
    for g in group_ids_b.unique():
        rows = group_ids_b == g
        s = scores_b[rows].float()
        if len(s) < 2:
            continue
        out[rows] = (s - s.mean()) / (s.std() + eps)
    return out


def combine_scores(
    sources: dict[str, torch.Tensor], weights: dict[str, float], group_ids_b: torch.Tensor, mode: str
) -> torch.Tensor:
    """[B] the training score from each source's [B] scores, by `weights` (every key a source) and `mode`."""
    missing = sorted(set(weights) - set(sources))
    assert not missing, f"reward sources {missing} were not scored"  # the plan and the trainer agree
    total = torch.zeros(len(group_ids_b), dtype=torch.float32)
    for name, w in weights.items():
        r = sources[name].float()
        total += w * (group_standardized(r, group_ids_b) if mode == "normalize_then_sum" else r)
    return total


def mix_scores(
    batch: Batch,
    weights: dict[str, float],
    mode: str,
    shaping: RewardConfig,
    max_response_length: int,
    reward_model: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The batch's training scores from its sources (the rule's `batch.scores`, the judge's, the `reward_model`'s
    where given), combined by `weights` and `mode`, then shaped (reward/shaping.py: the overlong penalty, the clamp),
    into `batch.scores`; returns the sources' raw scores."""
    assert batch.scores is not None
    sources = {"rule": batch.scores}
    if reward_model is not None:
        sources["reward_model"] = reward_model
    if batch.judge_scores is not None:
        sources["judge"] = batch.judge_scores
    batch.scores = combine_scores(sources, weights, batch.group_ids, mode)
    shape_scores(batch, shaping, max_response_length)
    return sources


def source_metrics(sources: dict[str, torch.Tensor], group: object = None) -> dict[str, float]:
    """reward/<source>/{mean, max, min} over every sample of the step on the ranks of `group`."""
    local: dict[str, tuple[str, float]] = {}
    for name, r in sources.items():
        r = r.float()
        local |= {
            f"reward/{name}/sum": ("sum", float(r.sum())),
            f"reward/{name}/count": ("sum", float(len(r))),
            f"reward/{name}/max": ("max", float(r.max()) if len(r) else -math.inf),
            f"reward/{name}/min": ("min", float(r.min()) if len(r) else math.inf),
        }
    out = reduce_metrics(local, group)
    for name in sources:
        out[f"reward/{name}/mean"] = out.pop(f"reward/{name}/sum") / max(out.pop(f"reward/{name}/count"), 1.0)
    return out
