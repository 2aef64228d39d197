"""Streaming groups with partial rollouts (rollout.partial_rollout): an engine keeps more prompts generating than a
step needs, a step takes the first groups that complete, and the unfinished requests carry on across weight updates.

    groups = GroupStream(source, InflightStream(engine), settings)
    part = groups.take(step)              # engine steps until this engine's share of complete groups is ready
    groups.fill(ahead=1, next_step=...)   # rollout ranks: fill the next batch while the actor trains
    groups.update(weights, version)       # at an engine-step boundary; the requests in flight go on

Every sample is one request of `rollout/inflight.py`'s stream, so every token keeps the policy version that
sampled it and the engine's logprob of it (`Batch.rollout_log_probs`: the behaviour policy the rollout correction
weighs against). A group is scored when its last sample finishes. Its staleness at step k is (k - 1) minus the
oldest version among its tokens; `max_staleness` drops a group before a step would take it, and stops generating
one that can no longer make it.

Determinism: the engine steps between two updates are counted, not timed (the rollout ranks take the new weights
after filling the batches ahead, not when they happen to arrive; rollout.update_on_arrival trades this for rollout
ranks that never wait while they have work: `generate_until`), and a checkpoint re-adds the requests in flight
with their tokens so far (`InflightStream.suspend`/`resume`), in the run that saves as in the run that resumes, so
2 steps + resume + 2 steps equals 4 straight.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import torch

from torchrl_post.engines.batch import collate, version_rows
from torchrl_post.rollout.filters import compact_filter, uniform_groups
from torchrl_post.rollout.inflight import InflightSample, InflightStream, sample_from_state, sample_state
from torchrl_post.rollout.source import EngineSource
from torchrl_post.rollout.taken import DoneGroup, TakenGroups
from torchrl_post.types import Batch, Generation


@dataclass(frozen=True)
class StreamSettings:
    in_flight: int
    """Prompt groups this engine keeps generating or completed-and-untaken (rollout.prompts_in_flight / engines)."""
    max_staleness: int | None
    """trainer.max_staleness."""


M = TypeVar("M")
"""What a group's members are when they end: finished samples (InflightSample) or episodes (Trajectory)."""


@dataclass
class PendingGroup(Generic[M]):
    """A prompt's group while its members (samples, or agent episodes) generate."""

    index: int
    """Its row in the training set."""
    position: int
    """Its position in the draw's batch (with the draw, its members' seeds)."""
    draw: int
    done: dict[int, M] = field(default_factory=dict)
    """Ended members by their index in the group."""


class Groups(ABC, Generic[M]):
    """An engine's streamed groups as the rollout ranks' program (rollout/remote.py: RolloutServer) and a
    colocated actor (rollout/local.py: LocalRollouts) drive them: single samples (`GroupStream`) or agent episodes
    (rollout/streaming_episodes.py: EpisodeGroupStream). Drawing the engine's shares of the sampler's batches,
    taking the first complete groups, filling ahead, generating until the weights arrive and the staleness bound
    are the same for both; what a member is, and how it steps, is the subclass's."""

    def __init__(self, source: EngineSource, settings: StreamSettings) -> None:
        self.source, self.settings = source, settings
        self.n = source.settings.group_size
        """Members per group (rollout.n)."""
        self.draws = 0
        self.pending: dict[str, PendingGroup[M]] = {}
        """group key (draw.position) -> its group."""
        self.ready: list[DoneGroup] = []
        self.share = 0
        """Groups per step from this engine (its share of the sampler's batch)."""
        self.positions: list[int] = []
        """This engine's positions in a step's batch (the ids its groups take)."""
        self.stale_dropped = 0
        self.engine_seconds = 0.0
        self.rejection = source.rejection
        self.rejected = 0
        """Uniform groups dropped since the last take (algorithm.rejection_sample)."""
        self.short = 0
        """Uniform groups kept at weight 0 since the last take (the budget of drops was spent)."""

    # ---- what a member is -----------------------------------------------------------------------------
    @abstractmethod
    def _in_flight(self) -> int:
        """Requests generating now."""

    @abstractmethod
    def _busy(self) -> bool:
        """Some member still generates (or waits for its environment)."""

    @abstractmethod
    def _advance(self) -> list[tuple[str, M]]:
        """One engine step: (request id "{group key}.{j}", member) of the members that ended."""

    @abstractmethod
    def _start(self, key: str, group: PendingGroup[M]) -> None:
        """Start the group's members from the beginning."""

    @abstractmethod
    def _scored(self, group: PendingGroup[M]) -> DoneGroup:
        """The complete group as a scored, filtered batch."""

    @abstractmethod
    def _too_old(self, oldest_allowed: int) -> list[str]:
        """Stop the groups still generating with a token older than `oldest_allowed`; returns their keys."""

    @abstractmethod
    def update(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """New weights at an engine-step boundary (rollout ranks); what is in flight goes on under `version`."""

    @abstractmethod
    def at_version(self, version: int) -> None:
        """The engine's weights were replaced outside the stream (a colocated sync) while it was suspended."""

    @abstractmethod
    def suspend(self) -> None:
        """Take the requests out of the engine (it sleeps, or validates); the next engine step re-adds them."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    # ---- a step ---------------------------------------------------------------------------------------
    def take(self, step: int) -> TakenGroups:
        """This engine's share of step `step`: the first complete groups within the staleness bound, relabelled
        with the engine's positions in the batch."""
        self.fill(1, step)
        taken, self.ready = self.ready[: self.share], self.ready[self.share :]
        for done, g in zip(taken, self.positions, strict=True):
            done.batch.group_ids = torch.full_like(done.batch.group_ids, g)
        rounds = -(-self.rejected // max(self.share, 1))
        out = TakenGroups(
            taken, self.engine_seconds, self.stale_dropped, self._in_flight(), self.rejected, rounds, self.short
        )
        self.stale_dropped, self.engine_seconds, self.rejected, self.short = 0, 0.0, 0, 0
        return out

    def fill(self, batches: int, next_step: int) -> None:
        """Generate until `batches` steps' shares of complete groups are ready, the next taken at `next_step`."""
        self._top_up()
        while True:
            self._drop_stale(next_step)
            if len(self.ready) >= batches * self.share:
                return
            self._top_up()
            if not self._busy():  # everything in flight was dropped as stale: more prompts, whatever fits
                self._draw()
            self._step()

    def generate_until(self, arrived: Callable[[], bool], next_step: int) -> int:
        """rollout.update_on_arrival: engine steps until `arrived()` (polled between them), starting new prompts
        while the groups kept in flight allow. Returns the engine steps taken; stops early when nothing is left
        to generate (every group in flight is complete and untaken: the caller waits)."""
        steps = 0
        while not arrived():
            self._drop_stale(next_step)
            self._top_up()
            if not self._busy():
                break
            self._step()
            steps += 1
        return steps

    # ---- drawing and completing -------------------------------------------------------------------------
    def _step(self) -> None:
        t = time.perf_counter()
        ended = self._advance()
        self.engine_seconds += time.perf_counter() - t
        for rid, member in ended:
            key, j = rid.rsplit(".", 1)
            group = self.pending[key]
            group.done[int(j)] = member
            if len(group.done) == self.n:
                del self.pending[key]
                self._admit(self._scored(group))

    def _admit(self, done: DoneGroup) -> None:
        """A complete group joins the ready ones, except that rejection sampling drops a group whose rewards are all
        equal (no GRPO signal) and another is drawn in its place; at most rejection_sample.max_extra_rounds x this
        engine's share are dropped between two steps, after which a uniform group is kept at weight 0 (it leaves
        every loss and denominator)."""
        if self.rejection.enable and uniform_groups(done.batch):
            if self.rejected < self.rejection.max_extra_rounds * max(self.share, 1):
                self.rejected += 1
                return
            done.batch.weights = torch.zeros_like(done.batch.weights)
            self.short += 1
        self.ready.append(done)

    def _top_up(self) -> None:
        """Draw another share of prompts while it fits in the groups kept in flight (always when idle)."""
        while not self.share or len(self.pending) + len(self.ready) + self.share <= self.settings.in_flight:
            self._draw()
            if not self.share:
                break

    def _draw(self) -> None:
        idx, positions = self.source.sampler.next_batch()
        self.share, self.positions = len(idx), positions
        self.draws += 1
        for index, position in zip(idx, positions, strict=True):
            key = f"{self.draws}.{position}"
            self.pending[key] = PendingGroup(index, position, self.draws)
            self._start(key, self.pending[key])

    def _drop_stale(self, next_step: int) -> None:
        """Drop what would exceed trainer.max_staleness when taken at `next_step` or later: complete groups, and
        groups still generating whose oldest token is already too old (their members are stopped)."""
        bound = self.settings.max_staleness
        if bound is None:
            return
        oldest_allowed = (next_step - 1) - bound
        kept = [d for d in self.ready if d.oldest >= oldest_allowed]
        self.stale_dropped += len(self.ready) - len(kept)
        self.ready = kept
        for key in self._too_old(oldest_allowed):
            del self.pending[key]
            self.stale_dropped += 1

    # ---- checkpoints --------------------------------------------------------------------------------------
    def _position_state(self) -> dict[str, Any]:
        """The sampler's position, the draws and the complete groups (plain values)."""
        return {
            "sampler": self.source.sampler.state_dict(),
            "draws": self.draws,
            "share": self.share,
            "positions": list(self.positions),
            "rejected": self.rejected,
            "short": self.short,
            "ready": [{"batch": d.batch.to_wire(), "oldest": d.oldest, "partial": d.partial} for d in self.ready],
        }

    def _load_position(self, state: dict[str, Any]) -> None:
        self.source.sampler.load_state_dict(state["sampler"])
        self.draws, self.share = int(state["draws"]), int(state["share"])
        self.positions = [int(p) for p in state["positions"]]
        self.rejected, self.short = int(state["rejected"]), int(state["short"])
        self.ready = [
            DoneGroup(Batch.from_wire(d["batch"]), int(d["oldest"]), int(d["partial"])) for d in state["ready"]
        ]


class GroupStream(Groups[InflightSample]):
    """One engine's groups: drawn in its share of the sampler's batches, generated as single-sample requests,
    completed, scored, taken in the order they complete."""

    def __init__(self, source: EngineSource, stream: InflightStream, settings: StreamSettings) -> None:
        super().__init__(source, settings)
        self.stream = stream

    def _in_flight(self) -> int:
        return len(self.stream.live)

    def _busy(self) -> bool:
        return bool(self.stream.live)

    def _advance(self) -> list[tuple[str, InflightSample]]:
        return [(s.request_id, s) for s in self.stream.step()]

    def update(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """New weights at this engine-step boundary (rollout ranks); the requests in flight go on."""
        self.stream.update(weights, version)
        self._drop_stale(version + 1)

    def at_version(self, version: int) -> None:
        """The engine's weights were replaced outside the stream (a colocated sync) while it was suspended."""
        self.stream.version = version

    def suspend(self) -> None:
        """Take the requests out of the engine (it sleeps, or validates); the next engine step re-adds them."""
        self.stream.suspend()

    def _start(self, key: str, group: PendingGroup[InflightSample]) -> None:
        """The group's samples, each a request seeded by its position and index in the group, with the prompt's
        images."""
        prompt = self.source.data.prompt_ids[group.index]
        params = replace(self.source.sampling(group.draw, validation=False), n=1)
        for j in range(self.n):
            self.stream.add(f"{key}.{j}", prompt, params, group.position * self.n + j, self._images(group.index))

    def _images(self, index: int) -> list[Any]:
        """The images of the training set's row `index` (none for a text-only model)."""
        return self.source.data.images[index] if self.source.data.images else []

    def _scored(self, group: PendingGroup[InflightSample]) -> DoneGroup:
        samples = [group.done[j] for j in range(self.n)]
        prompts = self.source.prompt_batch([group.index], [group.position])
        routes = [s.routes for s in samples if s.routes is not None]  # recorded for all or none
        gen = Generation(
            [s.tokens for s in samples],
            [s.logprobs for s in samples],
            [s.finish_reason or "length" for s in samples],
            routed_experts=routes or None,
        )
        batch = collate(prompts, gen, self.n, self.source.pad_id, self.source.vision)
        batch.behavior_versions = version_rows([s.versions for s in samples], batch.response_width)
        self.source.score(batch, prompts, self.n)
        if self.source.masked:
            compact_filter(batch, self.source.masked)
        versions = [v for s in samples for v in s.versions] or [self.stream.version]
        return DoneGroup(batch, min(versions), sum(s.spans > 1 for s in samples))

    def _too_old(self, oldest_allowed: int) -> list[str]:
        oldest: dict[str, int] = {}  # group key -> the oldest version among its tokens so far
        for s in [*self.stream.live.values(), *(s for g in self.pending.values() for s in g.done.values())]:
            if s.versions:
                key = s.request_id.rsplit(".", 1)[0]
                oldest[key] = min(oldest.get(key, s.versions[0]), s.versions[0])
        stale = [key for key in self.pending if key in oldest and oldest[key] < oldest_allowed]
        for key in stale:
            self.stream.drop([f"{key}.{j}" for j in range(self.n) if j not in self.pending[key].done])
        return stale

    # ---- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain values: the sampler's position, the groups generating (their finished samples and the requests in
        flight) and the complete ones. The requests in flight are re-added here (as after a resume), so the run
        that saves continues exactly as the run that resumes from it."""
        self.stream.suspend()
        return self._position_state() | {
            "version": self.stream.version,
            "pending": [
                {
                    "key": key,
                    "index": g.index,
                    "position": g.position,
                    "draw": g.draw,
                    "done": {str(j): sample_state(s) for j, s in g.done.items()},
                }
                for key, g in self.pending.items()
            ],
            "live": self.stream.export(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_position(state)
        self.pending = {}
        for g in state["pending"]:
            group: PendingGroup[InflightSample] = PendingGroup(int(g["index"]), int(g["position"]), int(g["draw"]))
            group.done = {int(j): sample_from_state(s) for j, s in g["done"].items()}
            self.pending[g["key"]] = group
        self.stream.adopt(state["live"], int(state["version"]))
        for rid, s in self.stream.live.items():  # the images are the data set's, not the state's
            s.images = self._images(self.pending[rid.rsplit(".", 1)[0]].index)
