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


def batch_metrics(batch: Batch, masked: Sequence[str], step: int) -> BatchStats:
    """Scores, lengths, advantages and filter fractions of the step's samples, reduced over every actor rank
    (the cell's default group); `masked`: the termination reasons compact filtering masks; `step`: the update
    this batch trains (its tokens' staleness is counted from the weights of update step - 1).

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
    if batch.behavior_versions is not None:
        local |= behavior_version_sums(batch.behavior_versions, batch.loss_mask, step - 1)
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
    if batch.behavior_versions is not None:
        out |= behavior_version_metrics(out, n)
    for key, values in batch.reward_extra.items():  # this rank's samples that returned the key
        given = values[~values.isnan()]
        if len(given):
            out[f"reward/{key}"] = float(given.mean())
    return BatchStats(out, tokens)


def behavior_version_sums(versions: torch.Tensor, mask: torch.Tensor, current: int) -> dict[str, tuple[str, float]]:
    """This rank's sums for `behavior_version_metrics`: over trained response tokens (`mask` > 0) with a known
    version (>= 0), each token's staleness `current - version` (`current`: the version the update starts from)."""
    trained = mask > 0
    known = trained & (versions >= 0)
    age = (current - versions)[known].double()
    newest = torch.where(known, versions, -1).amax(-1)
    oldest = torch.where(known, versions, torch.iinfo(torch.long).max).amin(-1)
    covered = known.any(-1)
    return {
        "bv_tokens": ("sum", float(trained.sum())),
        "bv_known": ("sum", float(known.sum())),
        "bv_age": ("sum", float(age.sum())),
        "bv_stale": ("sum", float((age > 0).sum())),
        "bv_covered": ("sum", float(covered.sum())),
        "bv_spans": ("sum", float((covered & (newest != oldest)).sum())),
        "training/off_policy/token_staleness/max": ("max", float(age.max()) if len(age) else -math.inf),
        "training/off_policy/token_staleness/min": ("min", float(age.min()) if len(age) else math.inf),
    }


def behavior_version_metrics(reduced: dict[str, float], samples: float) -> dict[str, float]:
    """verl's names, from the reduced sums (popped): token staleness mean/min/max and the stale tokens' fraction
    over the tokens with a known version; the fraction of those responses whose tokens span several versions;
    the coverage of responses and tokens (1: every trained token's version is known). No staleness without
    coverage."""
    tokens, known, age, stale = (reduced.pop(k) for k in ("bv_tokens", "bv_known", "bv_age", "bv_stale"))
    covered, spans = reduced.pop("bv_covered"), reduced.pop("bv_spans")
    out = {
        "training/off_policy/behavior_version/token_coverage": known / max(tokens, 1.0),
        "training/off_policy/behavior_version/response_coverage": covered / max(samples, 1.0),
    }
    if not known:
        reduced.pop("training/off_policy/token_staleness/max")
        reduced.pop("training/off_policy/token_staleness/min")
        return out
    return out | {
        "training/off_policy/token_staleness/mean": age / known,
        "training/off_policy/token_staleness/stale_fraction": stale / known,
        "training/off_policy/cross_version_response_fraction": spans / max(covered, 1.0),
    }


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
