"""Tensor-parallel lockstep: every rank of one engine submits the same requests, in the same order, before each
engine step. vLLM's external launcher runs one scheduler per rank and their model runners meet in collectives, so a
request added on one rank only, or in another order, gives silently wrong results, not an error.

    engine = Lockstep(engine, group, mirrored=True)   # the engine's ranks as one stepped engine
    engine.add_request(...); engine.abort([...])       # recorded, in order
    engine.step()                                       # the first rank's record is broadcast, then every rank steps

The group's first rank leads: its adds and aborts since the last step go to the others before each step. A rank
follows in one of two ways:
- mirrored (streamed groups): it runs the same program (the same draws, the same engine outputs), so it makes the
  same calls and applies them as it makes them; at each step its record is checked against the leader's (a
  difference is an error naming the first one, never a silent divergence).
- `follow()` (the agent loop, whose environments answer in thread order): it runs no program of its own; it applies
  the leader's record and steps until the leader's `finish()`.

`agreed(value, group)` gives every rank the leader's value of a decision made from timing (the weights' arrival with
rollout.update_on_arrival), so that the ranks still step alike. Weight loads, sleep and wake are the caller's: every
rank of a tensor-parallel engine makes them already (they are collectives inside the engine).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from torchrl_post.engines.base import SamplingParams, StepOutput

T = TypeVar("T")
DONE = "done"
"""What the leader's `finish` sends a `follow`ing rank."""


class Lockstep:
    """A stepped engine shared by the ranks of `group` (None: one rank, nothing to keep in step)."""

    def __init__(self, engine: Any, group: dist.ProcessGroup | None, mirrored: bool = True) -> None:
        self.engine, self.group, self.mirrored = engine, group, mirrored
        self.leader = group is None or dist.get_rank(group) == 0
        self._ops: list[tuple[Any, ...]] = []
        self.steps = 0
        """Engine steps taken (every rank counts the same)."""

    # ---- the stepped protocol -------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        uid: int,
        images: list[Any] | None = None,
    ) -> None:
        self._record(("add", request_id, prompt_ids, params, uid, images))

    def abort(self, request_ids: list[str]) -> None:
        self._record(("abort", list(request_ids)))

    def step(self) -> list[StepOutput]:
        if self.group is not None:
            if self.mirrored:  # every rank applied its own: compare what identifies them
                _check_same(self._share([_signature(op) for op in self._ops]), self._ops, dist.get_rank())
            else:
                ops = self._share(self._ops)
                for op in ops if not self.leader else ():
                    self._apply(op)
            self._ops = []
        self.steps += 1
        return list(self.engine.step())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.load_weights(weights)

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()

    # ---- decisions and followers ------------------------------------------------------------------------
    def follow(self) -> int:
        """A rank that runs no program of its own: apply the leader's adds and aborts and step, until `finish`.
        Returns the engine steps taken."""
        assert not self.leader and not self.mirrored, "the leader runs the program; a mirrored rank runs it too"
        steps = 0
        while True:
            ops = self._share(None)
            if ops == DONE:
                return steps
            for op in ops:
                self._apply(op)
            self.engine.step()
            self.steps += 1
            steps += 1

    def finish(self) -> None:
        """The leader's word to `follow`ing ranks that its program is done with the engine for now."""
        if self.group is not None and not self.mirrored:
            self._share(DONE)

    # ---- internals ------------------------------------------------------------------------------------
    def _record(self, op: tuple[Any, ...]) -> None:
        if self.group is not None:
            self._ops.append(op)
        if self.leader or self.mirrored:  # a following rank applies the leader's record at the step
            self._apply(op)

    def _apply(self, op: tuple[Any, ...]) -> None:
        if op[0] == "add":
            self.engine.add_request(*op[1:])
        else:
            self.engine.abort(op[1])

    def _share(self, ops: Any) -> Any:
        return agreed(ops, self.group)


def agreed(value: T, group: dist.ProcessGroup | None) -> T:
    """The first rank of `group`'s `value` on every rank of it (None: this rank's): a decision made from timing
    (which answers have arrived, which turns ran out of time) taken alike by ranks that run the same program."""
    if group is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, group=group, group_src=0)
    return box[0]  # type: ignore[no-any-return]


def _signature(op: tuple[Any, ...]) -> tuple[Any, ...]:
    """What identifies an operation: its kind and request ids (and the seed of an add)."""
    return (op[0], op[1], op[4]) if op[0] == "add" else (op[0], tuple(op[1]))


def _check_same(theirs: list[tuple[Any, ...]], mine: list[tuple[Any, ...]], rank: int) -> None:
    """A mirrored rank's adds and aborts since the last step against the leader's (their signatures)."""
    ours = [_signature(op) for op in mine]
    if ours == theirs:
        return
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    raise RuntimeError(
        f"tensor-parallel engine: rank {rank}'s requests differ from its engine's first rank at operation {first} "
        f"(this rank: {ours[first] if first < len(ours) else 'nothing'}, first rank: "
        f"{theirs[first] if first < len(theirs) else 'nothing'}); the ranks of one engine must draw the same prompts "
        "and make the same calls"
    )
