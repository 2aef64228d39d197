"""Streamed groups of agent episodes (rollout.partial_rollout with agent.env): multi-turn episodes carried across
weight updates the way `rollout/streaming.py` carries single samples.

    groups = EpisodeGroupStream(source, loop.episodes(recompute), settings, stepwise)
    part = groups.take(step)              # engine steps until this engine's share of complete groups is ready
    groups.fill(ahead=1, next_step=...)   # rollout ranks: fill the next batch while the actor trains
    groups.update(weights, version)       # at an engine-step boundary; the turns in flight go on

Prompts are drawn from the sampler as `GroupStream` draws them (the same group keys, positions and seeds); each
prompt's group is `rollout.n` episodes (agent/loop.py: Episodes), complete when all of them ended, then made
into a batch as the agent batches of a step are (one row per trajectory, or per turn with `stepwise`). Every
response token keeps the policy version that generated it, so a group's staleness at step k is (k - 1) minus the
oldest version among its tokens, and trainer.max_staleness drops it as it drops a group of single samples.

Checkpoints keep the complete groups and restart the groups still generating from their first turn (their
environments reset, their seeds as before), in the run that saves as in the run that resumes, so the two continue
alike; the saving run's engine also forgets its prefix cache (agent runs enable it), whose blocks may come from
earlier weights. That is exact when the environments answer in a fixed order: agent.env_workers=0 (a thread pool's answers
arrive when they are ready).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from torchrl_post.agent.base import Trajectory, steps_to_batch, trajectories_to_batch
from torchrl_post.agent.loop import EPISODE_SEED, Episodes
from torchrl_post.rollout.filters import compact_filter
from torchrl_post.rollout.source import EngineSource, episode_tasks
from torchrl_post.rollout.streaming import DoneGroup, StreamSettings, TakenGroups
from torchrl_post.types import Batch


@dataclass
class PendingEpisodes:
    """A prompt's group while its episodes run."""

    index: int
    """Its row in the training set."""
    position: int
    """Its position in the draw's batch (its episodes' uid and seeds)."""
    draw: int
    done: dict[int, Trajectory] = field(default_factory=dict)
    """Ended episodes by their index in the group."""


class EpisodeGroupStream:
    """One engine's groups of agent episodes: drawn in its share of the sampler's batches, run turn by turn,
    completed, taken in the order they complete (`streaming.Groups`)."""

    def __init__(self, source: EngineSource, episodes: Episodes, settings: StreamSettings, stepwise: bool) -> None:
        """`stepwise`: a row per turn (algorithm.stepwise_advantage), else one per trajectory."""
        self.source, self.episodes, self.settings, self.stepwise = source, episodes, settings, stepwise
        self.n = source.settings.group_size
        self.draws = 0
        self.pending: dict[str, PendingEpisodes] = {}
        """group key (draw.position) -> its group."""
        self.ready: list[DoneGroup] = []
        self.share = 0
        """Groups per step from this engine (its share of the sampler's batch)."""
        self.positions: list[int] = []
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
        out = TakenGroups(taken, self.stale_dropped, self.engine_seconds, len(self.episodes.live))
        self.stale_dropped, self.engine_seconds = 0, 0.0
        return out

    def fill(self, batches: int, next_step: int) -> None:
        """Run episodes until `batches` steps' shares of complete groups are ready, the next taken at `next_step`."""
        self._top_up()
        while True:
            self._drop_stale(next_step)
            if len(self.ready) >= batches * self.share:
                return
            self._top_up()
            if not self.episodes.running:  # everything in flight was dropped as stale: more prompts
                self._draw()
            t = time.perf_counter()
            ended = self.episodes.advance()
            self.engine_seconds += time.perf_counter() - t
            self._complete(ended)

    def update(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """New weights at this engine-step boundary (rollout ranks); the turns in flight go on."""
        self.episodes.update(weights, version)
        self._drop_stale(version + 1)

    def at_version(self, version: int) -> None:
        """The engine's weights were replaced outside the stream (a colocated sync) while it was suspended."""
        self.episodes.stream.version = version

    def suspend(self) -> None:
        """Take the turns in flight out of the engine (it sleeps, or validates); the next engine step re-adds them."""
        self.episodes.suspend()

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
        for index, position in zip(idx, positions, strict=True):
            key = f"{self.draws}.{position}"
            self.pending[key] = PendingEpisodes(index, position, self.draws)
            self._start(key, self.pending[key])

    def _start(self, key: str, group: PendingEpisodes) -> None:
        """The group's episodes from their first turn, seeded by its position and episode index."""
        prompts = self.source.prompt_batch([group.index], [group.position])
        ((uid, task),) = episode_tasks(prompts)
        starts = [(f"{key}.{j}", uid, task, j * EPISODE_SEED + uid) for j in range(self.n)]
        self.episodes.start(starts, self.source.sampling(group.draw, validation=False))

    def _complete(self, ended: list[tuple[str, Trajectory]]) -> None:
        for rid, traj in ended:
            key, j = rid.rsplit(".", 1)
            group = self.pending[key]
            group.done[int(j)] = traj
            if len(group.done) == self.n:
                del self.pending[key]
                self.ready.append(self._scored(group))

    def _scored(self, group: PendingEpisodes) -> DoneGroup:
        """The group as a batch, as a step's agent batch is made (agent/base.py), filtered like it."""
        trajectories = [group.done[j] for j in range(self.n)]
        pad_id = self.source.pad_id
        batch = steps_to_batch(trajectories, pad_id) if self.stepwise else trajectories_to_batch(trajectories, pad_id)
        if self.source.masked:
            compact_filter(batch, self.source.masked)
        versions = [v for t in trajectories for v in t.versions()] or [self.episodes.version]
        return DoneGroup(batch, min(versions), sum(len(set(t.versions())) > 1 for t in trajectories))

    def _drop_stale(self, next_step: int) -> None:
        """Drop what would exceed trainer.max_staleness when taken at `next_step` or later: complete groups, and
        groups still running whose oldest token is already too old (their episodes are stopped)."""
        bound = self.settings.max_staleness
        if bound is None:
            return
        kept = [d for d in self.ready if (next_step - 1) - d.oldest <= bound]
        self.stale_dropped += len(self.ready) - len(kept)
        self.ready = kept
        for key, group in list(self.pending.items()):
            running = [f"{key}.{j}" for j in range(self.n) if j not in group.done]
            versions = [v for t in group.done.values() for v in t.versions()]
            versions += [v for rid in running if (v := self.episodes.oldest(rid)) is not None]
            if versions and (next_step - 1) - min(versions) > bound:
                self.episodes.drop(running)
                del self.pending[key]
                self.stale_dropped += 1

    # ---- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain values: the sampler's position, the groups still running (restarted here from their first turn,
        as the run that resumes restarts them) and the complete ones."""
        self.episodes.drop([f"{key}.{j}" for key in self.pending for j in range(self.n)])
        self.episodes.forget_cache()
        for key, group in self.pending.items():
            group.done = {}
            self._start(key, group)
        return {
            "sampler": self.source.sampler.state_dict(),
            "draws": self.draws,
            "share": self.share,
            "positions": list(self.positions),
            "version": self.episodes.version,
            "pending": [
                {"key": key, "index": g.index, "position": g.position, "draw": g.draw}
                for key, g in self.pending.items()
            ],
            "ready": [{"batch": d.batch.to_wire(), "oldest": d.oldest, "partial": d.partial} for d in self.ready],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.sampler.load_state_dict(state["sampler"])
        self.draws, self.share = int(state["draws"]), int(state["share"])
        self.positions = [int(p) for p in state["positions"]]
        self.at_version(int(state["version"]))
        self.pending = {}
        for g in state["pending"]:
            self.pending[g["key"]] = PendingEpisodes(int(g["index"]), int(g["position"]), int(g["draw"]))
            self._start(g["key"], self.pending[g["key"]])
        self.ready = [
            DoneGroup(Batch.from_wire(d["batch"]), int(d["oldest"]), int(d["partial"])) for d in state["ready"]
        ]
