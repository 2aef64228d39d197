"""What a rollout producer hands a step, wherever it runs: whole scored groups and the counts its metrics need.

    groups.take(step) -> TakenGroups         # rollout/groups.py: whole batches or partial rollouts
    taken.parts()                            # group id -> (its rows, trimmed; the group it came from)
    taken.rows(owner)                        # one GroupRow per group: what the transfer plans with
    rollout_metrics(table, step, ...)        # the step's rollout/* metrics from every engine's rows

A colocated actor keeps its groups (rollout/local.py); rollout ranks hand them to the actor ranks
(rollout/remote.py); both compute the metrics with `rollout_metrics` from the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from torchrl_post.distributed.transfer import (
    ROW_DROPPED,
    ROW_GEN_MS,
    ROW_IN_FLIGHT,
    ROW_OWNER,
    ROW_PARTIAL,
    ROW_ROUNDS,
    ROW_SHORT,
    ROW_STALE_DROPPED,
    ROW_VERSION,
    ROW_WAIT_MS,
    GroupRow,
)
from torchrl_post.types import Batch

STALENESS_BINS = ("0", "1", "2", "3", "4+")
"""rollout/staleness_groups/<bin>: the step's groups by staleness (the same names on every rank)."""


def staleness_bin(staleness: int) -> str:
    return STALENESS_BINS[max(0, min(staleness, len(STALENESS_BINS) - 1))]


@dataclass
class DoneGroup:
    """A complete, scored group waiting for a step to take it."""

    batch: Batch
    oldest: int
    """The oldest policy version among its tokens."""
    partial: int = 0
    """Its samples whose tokens came from more than one policy version."""
    draw: int = 0
    position: int = 0
    """The draw it came from and its position in that draw's batch (whole batches are taken in this order)."""
    ticket: int | None = None
    """Its reward-model scores still to come from the reward model's ranks (rollout/scores.py)."""


@dataclass
class TakenGroups:
    """One step's share of an engine: whole groups, with what the step's metrics need."""

    groups: list[DoneGroup]
    engine_seconds: float
    """Generation since the last take."""
    stale_dropped: int = 0
    """Groups dropped since the last take for exceeding trainer.max_staleness."""
    in_flight: int = 0
    """Requests generating when the step took its groups."""
    rejected: int = 0
    """Uniform groups rejection sampling dropped since the last take (algorithm.rejection_sample)..."""
    rounds: int = 0
    """... the extra rounds of prompts that took (streamed: the engine's shares of replacements) ..."""
    short: int = 0
    """... and the uniform groups kept at weight 0 because the budget was spent."""
    reward_seconds: float = 0.0
    """Scoring and filtering complete groups since the last take."""
    env_seconds: float = 0.0
    """Agent episodes: their environments' and tools' time since the last take."""

    def batch(self, pad_id: int, keep: slice = slice(None)) -> Batch:
        """The `keep` groups as one batch."""
        kept = self.groups[keep]
        return kept[0].batch if len(kept) == 1 else Batch.concat([d.batch for d in kept], pad_id)

    def parts(self, keep: slice = slice(None)) -> dict[int, tuple[Batch, DoneGroup]]:
        """Group id -> (its rows, trimmed; where they came from), for the `keep` groups."""
        return {g: (part, d) for d in self.groups[keep] for g, part in d.batch.split_groups().items()}

    def rows(self, owner: int, leader: bool = True, keep: slice = slice(None)) -> list[GroupRow]:
        """The `keep` groups as the step's group rows (owner: the rank that holds them); the engine's counts on
        each of its rows, from its first rank only (`leader`: a tensor-parallel engine's other ranks hold the
        same groups)."""
        counts = (self.rejected, self.rounds, self.short, self.stale_dropped, self.in_flight) if leader else (0,) * 5
        dropped, rounds, short, stale, in_flight = counts
        ms = int(self.engine_seconds * 1000)
        rows = []
        for d in self.groups[keep]:
            tokens = d.batch.attention_mask.sum(-1)
            for g in d.batch.group_ids.unique().tolist():
                real = int(tokens[d.batch.group_ids == g].sum())
                rows.append(
                    GroupRow(g, owner, real, d.oldest, ms, dropped, rounds, short, partial=d.partial,
                             stale_dropped=stale, in_flight=in_flight)
                )  # fmt: skip
        return rows


@dataclass(frozen=True)
class Fill:
    """The rollout producer's fill policy: the run plan decides it (plan.py: fill_policy), rollout/groups.py reads it."""

    carry: bool
    """Unfinished members survive an update (rollout.partial_rollout); else whole batches, each to its end."""
    lag: int
    """Batches made ahead while the actor trains (trainer.max_off_policy_steps; rollout ranks only, 0 colocated)."""
    prompts_in_flight: int
    """Partial rollouts: groups generating or complete-and-untaken over all engines (rollout.prompts_in_flight;
    null: max(max_off_policy_steps + 1, 2) x the batch); whole batches: the batch."""
    per_engine: int
    recompute: bool
    """Requests in flight are re-prefilled at an update (rollout.inflight_update=recompute; always colocated)."""
    max_staleness: int | None
    on_arrival: bool
    """Rollout ranks generate until the new weights arrive (rollout.update_on_arrival; never colocated)."""

    def describe(self) -> str:
        ahead = f", {self.lag} ahead while the actor trains" if self.lag else ""
        bound = "no bound" if self.max_staleness is None else f"groups older than {self.max_staleness} dropped"
        if not self.carry:
            return f"rollouts: whole batches, each generated to its end with one set of weights{ahead}"
        kv = "re-prefilled under the new weights" if self.recompute else "continue with their KV cache"
        when = "when they arrive (not reproducible step for step)" if self.on_arrival else "after the fill"
        return (
            f"rollouts: partial, {self.prompts_in_flight} prompts in flight ({self.per_engine} per engine){ahead}; "
            f"weights taken {when}; at an update the requests in flight {kv}; staleness: {bound}"
        )


def gather_rows(rows: list[GroupRow]) -> list[GroupRow]:
    """Every actor rank's group rows (the cell's default group), in rank order."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return rows
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, rows)
    return [GroupRow(*r) for part in parts for r in part]


def rollout_metrics(
    table: torch.Tensor, step: int, group_size: int, streaming: bool, rejection: bool
) -> dict[str, float]:
    """The step's rollout metrics from the group rows of every engine, wherever the groups were made (colocated
    or on rollout ranks): staleness (the oldest group's, the mean and a histogram by group), the slowest engine's
    time, the longest wait of a rollout rank in the last step's exchanges; with streaming, partial samples, stale
    drops and the requests in flight; with rejection sampling, its counts."""
    staleness = (step - 1) - table[:, ROW_VERSION]
    engines = {int(row[ROW_OWNER]): row for row in table}  # per-engine counts sit on each of its rows
    out = {
        "rollout/staleness": float(staleness.max().item()),
        "rollout/staleness_mean": float(staleness.double().mean().item()),
        "timing_s/gen_engine": table[:, ROW_GEN_MS].max().item() / 1000,
        "timing_s/rollout_wait": max(int(r[ROW_WAIT_MS]) for r in engines.values()) / 1000,
    }
    bins = [staleness_bin(int(s)) for s in staleness.tolist()]
    out |= {f"rollout/staleness_groups/{b}": float(bins.count(b)) for b in STALENESS_BINS}
    if streaming:
        out["rollout/partial_samples"] = float(table[:, ROW_PARTIAL].sum().item()) / (len(table) * group_size)
        out["rollout/stale_dropped_groups"] = float(sum(int(r[ROW_STALE_DROPPED]) for r in engines.values()))
        out["rollout/in_flight"] = float(sum(int(r[ROW_IN_FLIGHT]) for r in engines.values()))
    if rejection:
        for name, col in (("dropped_groups", ROW_DROPPED), ("extra_rounds", ROW_ROUNDS), ("short_groups", ROW_SHORT)):
            out[f"filter/rejection/{name}"] = float(sum(int(r[col]) for r in engines.values()))
    return out
