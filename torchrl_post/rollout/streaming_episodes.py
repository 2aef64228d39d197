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

from collections.abc import Iterable
from typing import Any

import torch

from torchrl_post.agent.base import Trajectory, steps_to_batch, trajectories_to_batch
from torchrl_post.agent.loop import EPISODE_SEED, Episodes
from torchrl_post.rollout.filters import compact_filter
from torchrl_post.rollout.source import EngineSource, episode_tasks
from torchrl_post.rollout.streaming import DoneGroup, Groups, PendingGroup, StreamSettings


class EpisodeGroupStream(Groups[Trajectory]):
    """One engine's groups of agent episodes: drawn in its share of the sampler's batches, run turn by turn,
    completed, taken in the order they complete."""

    def __init__(self, source: EngineSource, episodes: Episodes, settings: StreamSettings, stepwise: bool) -> None:
        """`stepwise`: a row per turn (algorithm.stepwise_advantage), else one per trajectory."""
        super().__init__(source, settings)
        self.episodes, self.stepwise = episodes, stepwise

    def _in_flight(self) -> int:
        return len(self.episodes.live)

    def _busy(self) -> bool:
        return bool(self.episodes.running)

    def _advance(self) -> list[tuple[str, Trajectory]]:
        return self.episodes.advance()

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

    def _start(self, key: str, group: PendingGroup[Trajectory]) -> None:
        """The group's episodes from their first turn, seeded by its position and episode index."""
        prompts = self.source.prompt_batch([group.index], [group.position])
        ((uid, task),) = episode_tasks(prompts)
        starts = [(f"{key}.{j}", uid, task, j * EPISODE_SEED + uid) for j in range(self.n)]
        self.episodes.start(starts, self.source.sampling(group.draw, validation=False))

    def _scored(self, group: PendingGroup[Trajectory]) -> DoneGroup:
        """The group as a batch, as a step's agent batch is made (agent/base.py), filtered like it."""
        trajectories = [group.done[j] for j in range(self.n)]
        pad_id = self.source.pad_id
        batch = steps_to_batch(trajectories, pad_id) if self.stepwise else trajectories_to_batch(trajectories, pad_id)
        if self.source.masked:
            compact_filter(batch, self.source.masked)
        versions = [v for t in trajectories for v in t.versions()] or [self.episodes.version]
        return DoneGroup(batch, min(versions), sum(len(set(t.versions())) > 1 for t in trajectories))

    def _too_old(self, oldest_allowed: int) -> list[str]:
        stale = []
        for key, group in self.pending.items():
            running = [f"{key}.{j}" for j in range(self.n) if j not in group.done]
            versions = [v for t in group.done.values() for v in t.versions()]
            versions += [v for rid in running if (v := self.episodes.oldest(rid)) is not None]
            if versions and min(versions) < oldest_allowed:
                self.episodes.drop(running)
                stale.append(key)
        return stale

    # ---- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain values: the sampler's position, the groups still running (restarted here from their first turn,
        as the run that resumes restarts them) and the complete ones."""
        self.episodes.drop([f"{key}.{j}" for key in self.pending for j in range(self.n)])
        self.episodes.forget_cache()
        for key, group in self.pending.items():
            group.done = {}
            self._start(key, group)
        return self._position_state() | {
            "version": self.episodes.version,
            "pending": [
                {"key": key, "index": g.index, "position": g.position, "draw": g.draw}
                for key, g in self.pending.items()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_position(state)
        self.at_version(int(state["version"]))
        self.pending = {}
        for g in state["pending"]:
            self.pending[g["key"]] = PendingGroup(int(g["index"]), int(g["position"]), int(g["draw"]))
            self._start(g["key"], self.pending[g["key"]])
