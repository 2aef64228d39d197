"""The metrics of a step's batch: scores, lengths, advantages, filters and agent episodes, over every actor rank."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from torchrl_post.agent.base import AGENT_TERMINATIONS, METRIC_NAMES
from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.types import TERMINATIONS, Batch


@dataclass(frozen=True)
class BatchStats:
    metrics: dict[str, float]
    tokens: float
    """Prompt and response tokens of the batch over every actor rank (for perf/throughput)."""


def batch_metrics(batch: Batch, masked: Sequence[str]) -> BatchStats:
    """Scores, lengths, advantages and filter fractions of the step's samples, reduced over every actor rank
    (the cell's default group); `masked`: the termination reasons compact filtering masks.

    `critic/full-score/{mean,max,min}` (rLLM's name for the average trajectory reward) take each trajectory's
    reward once: a single-turn sample's score, a step-wise trajectory's on its last step, not once per step; the
    mean is `critic/score/mean`'s. rLLM logs it before rejection sampling drops uniform groups; here it covers the
    step's batch (a filler group at weight 0 included), as every other batch metric.
    """
    assert batch.scores is not None and batch.advantages is not None and batch.reward_errors is not None
    mask, scores = batch.response_mask, batch.scores
    scored = _trajectory_rows(batch)  # a step-wise trajectory's score counts once
    full = scores[scored]  # one reward per trajectory (a rank may hold none: step-wise padding only)
    resp_len = mask.sum(-1)
    loss_tokens = max(batch.loss_mask.sum().item(), 1.0)
    # Compact filtering: the fraction of samples masked for each flagged termination reason.
    local = {
        f"filter/{reason}": ("sum", float((batch.termination == TERMINATIONS.index(reason)).sum())) for reason in masked
    }
    if batch.turns is not None:  # agent episodes: turns, tool calls and why they ended, per trajectory
        local |= _trajectory_sums(batch)
    out = reduce_metrics(
        local
        | {
            "n": ("sum", float(len(batch))),
            "score": ("sum", float(scores[scored].sum())),
            "scored": ("sum", float(scored.sum())),
            "resp_len": ("sum", float(resp_len.sum())),
            "prompt_len": ("sum", float((batch.attention_mask.sum(-1) - resp_len).sum())),
            "length": ("sum", float((batch.termination == TERMINATIONS.index("length")).sum())),
            "reward/errors": ("sum", float(batch.reward_errors.sum())),
            "critic/advantages/mean": ("mean", float((batch.advantages * batch.loss_mask).sum() / loss_tokens)),
            "tokens": ("sum", float(batch.attention_mask.sum())),
            "critic/score/max": ("max", float(scores.max())),
            "critic/score/min": ("min", float(scores.min())),
            "critic/full-score/max": ("max", float(full.max()) if len(full) else -math.inf),
            "critic/full-score/min": ("min", float(full.min()) if len(full) else math.inf),
            "response_length/max": ("max", float(resp_len.max())),
        }
    )
    n, tokens = out.pop("n"), out.pop("tokens")
    out |= {k: v / n for k, v in out.items() if k.startswith("filter/")}
    if "trajectories" in out:
        trajectories = max(out.pop("trajectories"), 1.0)
        out |= {k: v / trajectories for k, v in out.items() if k.startswith("agent/") and k != "agent/tool_errors"}
    mean = out.pop("score") / max(out.pop("scored"), 1.0)
    out["critic/score/mean"] = out["critic/rewards/mean"] = out["critic/full-score/mean"] = mean
    out["response_length/mean"] = out.pop("resp_len") / n
    out["response_length/clip_ratio"] = out.pop("length") / n
    out["prompt_length/mean"] = out.pop("prompt_len") / n
    for key, values in batch.reward_extra.items():  # this rank's samples that returned the key
        given = values[~values.isnan()]
        if len(given):
            out[f"reward/{key}"] = float(given.mean())
    return BatchStats(out, tokens)


def _trajectory_sums(batch: Batch) -> dict[str, tuple[str, float]]:
    """Sums over this rank's agent trajectories (one row each; a step-wise batch counts its last steps)."""
    assert batch.turns is not None and batch.tool_calls is not None and batch.tool_errors is not None
    rows = _trajectory_rows(batch)
    out = {
        "trajectories": ("sum", float(rows.sum())),
        "agent/num_turns/mean": ("sum", float(batch.turns[rows].sum())),
        "agent/tool_calls/mean": ("sum", float(batch.tool_calls[rows].sum())),
        "agent/tool_errors": ("sum", float(batch.tool_errors[rows].sum())),
    }
    for reason in AGENT_TERMINATIONS:
        out[f"agent/termination/{METRIC_NAMES.get(reason, reason)}"] = (
            "sum",
            float((batch.termination[rows] == TERMINATIONS.index(reason)).sum()),
        )
    return out


def _trajectory_rows(batch: Batch) -> torch.Tensor:
    """[B] bool: one row per sample, or per trajectory in a step-wise batch (its last step; no padding)."""
    if batch.traj_ids is None or batch.step_ids is None or batch.turns is None:
        return torch.ones(len(batch), dtype=torch.bool)
    return (batch.traj_ids >= 0) & (batch.step_ids == (batch.turns.long() - 1).clamp(min=0))
