"""Whole batches: each step's prompts generated together with one set of weights, up to `lag` steps ahead.

    batches = AheadBatches(source, lag=1, total_steps=100)
    taken = batches.take(step)       # batch `step`: made now, or earlier and queued
    batches.fill(1, step + 1)        # rollout ranks: make batch step + lag while the actor trains
    batches.update(weights, step)    # the next batches come from these weights

On-policy (lag 0, and always colocated) batch k is made at step k with the weights of update k - 1 (staleness 0);
with look-ahead (trainer.max_off_policy_steps = s) batch k + s is made while the actor updates step k, with the
weights of update k - 1 (staleness s). The queue and the source's position after the last batch handed over are
the checkpoint's: a resumed run continues with the very batches the uninterrupted run would have used.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from torchrl_post.engines.batch import stamp_versions
from torchrl_post.rollout.source import EngineSource
from torchrl_post.rollout.taken import DoneGroup, TakenGroups
from torchrl_post.types import Batch


@dataclass
class Made:
    """A batch made ahead: its step, its groups and counts, the source's state after making it."""

    step: int
    taken: TakenGroups
    state: dict[str, Any]


class AheadBatches:
    """The `Producer` of whole batches (rollout/taken.py) over an engine source."""

    def __init__(self, source: EngineSource, lag: int = 0, total_steps: int = 1 << 62) -> None:
        """`lag`: trainer.max_off_policy_steps (rollout ranks; 0 colocated)."""
        self.source, self.lag, self.total_steps = source, lag, total_steps
        self.ahead: deque[Made] = deque()
        self.version = 0
        self.sent_state: dict[str, Any] = source.state_dict()

    def take(self, step: int) -> TakenGroups:
        nxt = self.ahead[-1].step + 1 if self.ahead else step
        while nxt <= min(step + max(self.lag, 1) - 1, self.total_steps):  # after a start or resume
            self._make(nxt)
            nxt += 1
        made = self.ahead.popleft()
        assert made.step == step, f"rollout queue holds step {made.step}, the actor is at {step}"
        self.sent_state = made.state
        return made.taken

    def fill(self, batches: int, next_step: int) -> None:
        last = self.ahead[-1].step if self.ahead else next_step - 1
        while last < min(next_step - 1 + batches, self.total_steps):
            last += 1
            self._make(last)  # overlaps the actor's update

    def generate_until(self, arrived: Callable[[], bool], next_step: int) -> int:
        raise AssertionError("rollout.update_on_arrival streams groups (the plan refuses it for whole batches)")

    def update(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.source.engine.load_weights(weights)
        self.version = version

    def at_version(self, version: int) -> None:
        self.version = version

    def suspend(self) -> None:
        pass  # nothing generates between two batches

    def _make(self, step: int) -> None:
        """Draw this engine's share of batch `step`, generate and score it, queue it."""
        start = time.perf_counter()
        batch = self.source.produce(step)
        stamp_versions(batch, self.version)
        counts = self.source.filter_counts
        taken = TakenGroups(
            [DoneGroup(batch, self.version)],
            time.perf_counter() - start,
            rejected=counts["dropped_groups"],
            rounds=counts["extra_rounds"],
            short=counts["short_groups"],
        )
        self.ahead.append(Made(step, taken, self.source.state_dict()))

    # ---- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The source's state after the last batch handed over, and the queue (plain values)."""
        return {"source": self.sent_state, "version": self.version, "ahead": [_made_state(m) for m in self.ahead]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sent_state = state["source"]
        self.version = int(state["version"])
        self.ahead = deque(_made_from_state(m) for m in state["ahead"])
        # The source continues after the last batch made, not the last one sent.
        self.source.load_state_dict(self.ahead[-1].state if self.ahead else self.sent_state)


def _made_state(m: Made) -> dict[str, Any]:
    t = m.taken
    groups = [{"batch": d.batch.to_wire(), "oldest": d.oldest} for d in t.groups]
    counts = [t.rejected, t.rounds, t.short]
    return {"step": m.step, "groups": groups, "seconds": t.engine_seconds, "counts": counts, "state": m.state}


def _made_from_state(state: dict[str, Any]) -> Made:
    groups = [DoneGroup(Batch.from_wire(g["batch"]), int(g["oldest"])) for g in state["groups"]]
    rejected, rounds, short = (int(c) for c in state["counts"])
    taken = TakenGroups(groups, float(state["seconds"]), rejected=rejected, rounds=rounds, short=short)
    return Made(int(state["step"]), taken, state["state"])
