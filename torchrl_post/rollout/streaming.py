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
after filling the batches ahead, not when they happen to arrive), and a checkpoint re-adds the requests in flight
with their tokens so far (`InflightStream.suspend`/`resume`), in the run that saves as in the run that resumes, so
2 steps + resume + 2 steps equals 4 straight.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from torchrl_post.data.dataset import PromptDataset
from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.rollout.base import collate
from torchrl_post.rollout.filters import compact_filter
from torchrl_post.rollout.inflight import InflightSample, InflightStream, sample_from_state, sample_state
from torchrl_post.rollout.source import EngineSource
from torchrl_post.types import Batch, Generation

STALENESS_BINS = ("0", "1", "2", "3", "4+")
"""rollout/staleness_groups/<bin>: the step's groups by staleness (the same names on every rank)."""


def staleness_bin(staleness: int) -> str:
    return STALENESS_BINS[max(0, min(staleness, len(STALENESS_BINS) - 1))]


@dataclass(frozen=True)
class StreamSettings:
    in_flight: int
    """Prompt groups this engine keeps generating or completed-and-untaken (rollout.prompts_in_flight / engines)."""
    max_staleness: int | None
    """trainer.max_staleness."""


@dataclass
class PendingGroup:
    """A prompt's group while its samples generate."""

    index: int
    """Its row in the training set."""
    position: int
    """Its position in the draw's batch (with the draw, its samples' seeds)."""
    draw: int
    done: dict[int, InflightSample] = field(default_factory=dict)
    """Finished samples by their index in the group."""


@dataclass
class DoneGroup:
    """A complete, scored group waiting for a step to take it."""

    batch: Batch
    oldest: int
    """The oldest policy version among its tokens."""
    partial: int
    """Its samples whose tokens came from more than one policy version."""


@dataclass
class TakenGroups:
    """One step's share of an engine: whole groups, with what the step's metrics need."""

    groups: list[DoneGroup]
    stale_dropped: int
    """Groups dropped since the last take for exceeding trainer.max_staleness."""
    engine_seconds: float
    """Engine stepping since the last take."""
    in_flight: int
    """Requests generating when the step took its groups."""


class Groups(Protocol):
    """An engine's streamed groups as the rollout ranks' program (rollout/remote.py: StreamingServer) and a
    colocated actor (`StreamingSource`) drive them: single samples (`GroupStream`) or agent episodes
    (rollout/streaming_episodes.py: EpisodeGroupStream)."""

    n: int
    """Samples (or episodes) per group."""

    def take(self, step: int) -> TakenGroups:
        """This engine's share of step `step`: the first complete groups within the staleness bound."""
        ...

    def fill(self, batches: int, next_step: int) -> None:
        """Generate until `batches` steps' shares of complete groups are ready, the next taken at `next_step`."""
        ...

    def update(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """New weights at an engine-step boundary; what is in flight goes on under `version`."""
        ...

    def at_version(self, version: int) -> None:
        """The engine's weights were replaced outside the stream while it was suspended."""
        ...

    def suspend(self) -> None:
        """Take the requests out of the engine; the next engine step re-adds them."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class GroupStream:
    """One engine's groups: drawn in its share of the sampler's batches, generated as single-sample requests,
    completed, scored, taken in the order they complete."""

    def __init__(self, source: EngineSource, stream: InflightStream, settings: StreamSettings) -> None:
        self.source, self.stream, self.settings = source, stream, settings
        self.n = source.settings.group_size
        self.draws = 0
        self.pending: dict[str, PendingGroup] = {}
        """group key (draw.position) -> its group."""
        self.ready: list[DoneGroup] = []
        self.share = 0
        """Groups per step from this engine (its share of the sampler's batch)."""
        self.positions: list[int] = []
        """This engine's positions in a step's batch (the ids its groups take)."""
        self.stale_dropped = 0
        self.engine_seconds = 0.0

    # ---- a step ---------------------------------------------------------------------------------------
    def take(self, step: int) -> TakenGroups:
        """This engine's share of step `step`: the first complete groups within the staleness bound, relabelled
        with the engine's positions in the batch."""
        self.fill(1, step)
        taken, self.ready = self.ready[: self.share], self.ready[self.share :]
        for done, g in zip(taken, self.positions, strict=True):
            done.batch.group_ids = torch.full_like(done.batch.group_ids, g)
        out = TakenGroups(taken, self.stale_dropped, self.engine_seconds, len(self.stream.live))
        self.stale_dropped, self.engine_seconds = 0, 0.0
        return out

    def fill(self, batches: int, next_step: int) -> None:
        """Generate until `batches` steps' shares of complete groups are ready, the next taken at `next_step`."""
        self._top_up()
        while True:
            self._drop_stale(next_step)
            if len(self.ready) >= batches * self.share:
                return
            self._top_up()
            if not self.stream.live:  # everything in flight was dropped as stale: more prompts, whatever fits
                self._draw()
            t = time.perf_counter()
            finished = self.stream.step()
            self.engine_seconds += time.perf_counter() - t
            self._complete(finished)

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

    # ---- drawing and completing -------------------------------------------------------------------------
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
        prompts = self.source.prompt_batch(idx, positions)
        params = replace(self.source.sampling(self.draws, validation=False), n=1)
        for index, position, prompt in zip(idx, positions, prompts.prompt_ids, strict=True):
            key = f"{self.draws}.{position}"
            self.pending[key] = PendingGroup(index, position, self.draws)
            for j in range(self.n):
                self.stream.add(f"{key}.{j}", prompt, params, uid=position * self.n + j)

    def _complete(self, finished: list[InflightSample]) -> None:
        for sample in finished:
            key, j = sample.request_id.rsplit(".", 1)
            group = self.pending[key]
            group.done[int(j)] = sample
            if len(group.done) == self.n:
                del self.pending[key]
                self.ready.append(self._scored(group))

    def _scored(self, group: PendingGroup) -> DoneGroup:
        samples = [group.done[j] for j in range(self.n)]
        prompts = self.source.prompt_batch([group.index], [group.position])
        gen = Generation(
            [s.tokens for s in samples], [s.logprobs for s in samples], [s.finish_reason or "length" for s in samples]
        )
        batch = collate(prompts, gen, self.n, self.source.pad_id)
        self.source.score(batch, prompts, self.n)
        if self.source.masked:
            compact_filter(batch, self.source.masked)
        versions = [v for s in samples for v in s.versions] or [self.stream.version]
        return DoneGroup(batch, min(versions), sum(s.spans > 1 for s in samples))

    def _drop_stale(self, next_step: int) -> None:
        """Drop what would exceed trainer.max_staleness when taken at `next_step` or later: complete groups, and
        groups still generating whose oldest token is already too old (their requests are aborted)."""
        bound = self.settings.max_staleness
        if bound is None:
            return
        kept = [d for d in self.ready if (next_step - 1) - d.oldest <= bound]
        self.stale_dropped += len(self.ready) - len(kept)
        self.ready = kept
        oldest: dict[str, int] = {}  # group key -> the oldest version among its tokens so far
        for s in [*self.stream.live.values(), *(s for g in self.pending.values() for s in g.done.values())]:
            if s.versions:
                key = s.request_id.rsplit(".", 1)[0]
                oldest[key] = min(oldest.get(key, s.versions[0]), s.versions[0])
        for key, group in list(self.pending.items()):
            if key in oldest and (next_step - 1) - oldest[key] > bound:
                self.stream.drop([f"{key}.{j}" for j in range(self.n) if j not in group.done])
                del self.pending[key]
                self.stale_dropped += 1

    # ---- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain values: the sampler's position, the groups generating (their finished samples and the requests in
        flight) and the complete ones. The requests in flight are re-added here (as after a resume), so the run
        that saves continues exactly as the run that resumes from it."""
        self.stream.suspend()
        return {
            "sampler": self.source.sampler.state_dict(),
            "draws": self.draws,
            "share": self.share,
            "positions": list(self.positions),
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
            "ready": [{"batch": d.batch.to_wire(), "oldest": d.oldest, "partial": d.partial} for d in self.ready],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.sampler.load_state_dict(state["sampler"])
        self.draws, self.share = int(state["draws"]), int(state["share"])
        self.positions = [int(p) for p in state["positions"]]
        self.pending = {}
        for g in state["pending"]:
            group = PendingGroup(int(g["index"]), int(g["position"]), int(g["draw"]))
            group.done = {int(j): sample_from_state(s) for j, s in g["done"].items()}
            self.pending[g["key"]] = group
        self.stream.adopt(state["live"], int(state["version"]))
        self.ready = [
            DoneGroup(Batch.from_wire(d["batch"]), int(d["oldest"]), int(d["partial"])) for d in state["ready"]
        ]


class StreamingSource:
    """Colocated rollout.partial_rollout: the actor's ranks stream their engines' groups between updates.

    A step takes this rank's share of complete groups, then suspends the requests still generating (the engine
    sleeps and the update runs); the next step adds them again with their tokens so far, so the new weights
    prefill them (colocated engines always recompute) and they carry on under the new version.
    """

    def __init__(self, source: EngineSource, groups: Groups) -> None:
        self.source, self.groups = source, groups
        self._local: dict[str, tuple[str, float]] = {}

    def next_batch(self, step: int) -> Batch:
        self.groups.at_version(step - 1)  # the sync after update step - 1 loaded its weights
        start = time.perf_counter()
        taken = self.groups.take(step)
        self.groups.suspend()
        self.source.engine.sleep()
        self.source.timer.seconds["gen"] = time.perf_counter() - start
        self.source.timer.seconds["gen_engine"] = taken.engine_seconds
        staleness = [(step - 1) - d.oldest for d in taken.groups]
        bins = [staleness_bin(s) for s in staleness]
        self._local = {
            "rollout/staleness": ("max", float(max(staleness))),
            "staleness_sum": ("sum", float(sum(staleness))),
            "groups": ("sum", float(len(taken.groups))),
            "partial": ("sum", float(sum(d.partial for d in taken.groups))),
            "rollout/stale_dropped_groups": ("sum", float(taken.stale_dropped)),
            "rollout/in_flight": ("sum", float(taken.in_flight)),
        } | {f"rollout/staleness_groups/{b}": ("sum", float(bins.count(b))) for b in STALENESS_BINS}
        return Batch.concat([d.batch for d in taken.groups], self.source.pad_id)

    def metrics(self) -> dict[str, float]:
        """Reduced over the actor's ranks (every rank calls it)."""
        out = reduce_metrics(self._local)
        groups = out.pop("groups")
        out["rollout/staleness_mean"] = out.pop("staleness_sum") / groups
        out["rollout/partial_samples"] = out.pop("partial") / (groups * self.groups.n)
        return out

    @property
    def epoch(self) -> int:
        return self.source.epoch

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return self.source.validation_totals(data, sources)  # the stream is suspended between steps

    @property
    def val_samples(self) -> list[dict[str, Any]]:
        return self.source.val_samples

    def state_dict(self) -> dict[str, Any]:
        return {"groups": self.groups.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups.load_state_dict(state["groups"])

    def shutdown(self) -> None:
        self.source.shutdown()
