"""The one rollout producer: an engine's prompt groups, drawn in its share of the sampler's batches, generated member
by member (a member is one sample, or one agent episode of several turns), scored when the last member ends,
admitted (rejection sampling), and taken by the steps. How far ahead, and whether unfinished members survive an
update, is the run plan's fill policy (`rollout.taken.Fill`), which this class only reads:

    groups = Groups(source, Samples(source, stream, fill.carry), fill)   # or EpisodeMembers: agent episodes
    part = groups.take(step)              # engine steps until this engine's share of complete groups is ready
    groups.fill(ahead=1, next_step=...)   # rollout ranks: fill the next batch(es) while the actor trains
    groups.update(weights, version)       # at an engine-step boundary

Whole batches (`fill.carry` false): each draw is generated to its end and taken in draw order. Partial rollouts
(`fill.carry`): a step takes the first groups to complete and unfinished members carry on across updates. Every
token keeps its policy version (rollout/inflight.py). docs/async.md says what each choice means, how seeds follow the
draw and how a checkpoint makes a run resume exactly.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

import torch

from torchrl_post.agent.base import Trajectory, steps_to_batch, trajectories_to_batch
from torchrl_post.checkpoint.dcp import partial_rollout_changed
from torchrl_post.engines.batch import collate, version_rows
from torchrl_post.reward.mixing import mix_scores
from torchrl_post.reward.shaping import shape_scores
from torchrl_post.rollout.episodes import EPISODE_SEED, Episodes
from torchrl_post.rollout.filters import compact_filter, uniform_groups
from torchrl_post.rollout.inflight import InflightSample, InflightStream, sample_from_state, sample_state
from torchrl_post.rollout.scores import GroupScores
from torchrl_post.rollout.source import EngineSource, episode_tasks
from torchrl_post.rollout.taken import DoneGroup, Fill, TakenGroups
from torchrl_post.types import Batch, Generation, PromptBatch


class Versioned(Protocol):
    """An ended member: a finished sample (InflightSample) or an episode (Trajectory)."""

    @property
    def versions(self) -> list[int]:
        """The policy version of each generated token."""
        ...


M = TypeVar("M", bound=Versioned)


@dataclass
class PendingGroup(Generic[M]):
    """A prompt's group while its members generate."""

    index: int
    """Its row in the training set."""
    position: int
    """Its position in the draw's batch (with the draw, its members' seeds)."""
    draw: int
    done: dict[int, M] = field(default_factory=dict)
    """Ended members by their index in the group."""


class Runner(Protocol[M]):
    """What steps a group's members, by member id "{group key}.{j}": the `InflightStream` of single samples, or
    agent episodes (rollout/episodes.py: `Episodes`)."""

    @property
    def live(self) -> Mapping[str, Any]:
        """The members generating (or waiting for their environment)."""
        ...

    @property
    def running(self) -> bool:
        """Some member is live, or ended and not yet returned by `advance`."""
        ...

    def advance(self) -> list[tuple[str, M]]:
        """One engine step: (member id, member) of the members that ended."""
        ...

    def oldest(self, member_id: str) -> int | None:
        """The oldest version among a live member's tokens so far (None: none yet, or not live)."""
        ...

    def drop(self, member_ids: list[str]) -> None:
        """Stop these members for good."""
        ...


class Members(ABC, Generic[M]):
    """What a member is, single samples (`Samples`) or agent episodes (`EpisodeMembers`): how a group's members start,
    become a batch and go through a checkpoint. `runner` steps them; `stream` is the `InflightStream` under it, whose
    version the next generated tokens come from."""

    runner: Runner[M]
    stream: InflightStream

    def env_seconds(self) -> float:
        """Seconds the members' environments took so far (0 for single samples)."""
        return 0.0

    @abstractmethod
    def start(self, key: str, group: PendingGroup[M], n: int) -> None:
        """Start the group's `n` members from the beginning."""

    @abstractmethod
    def batch(self, group: PendingGroup[M], members: list[M]) -> Batch:
        """The complete group as a scored batch."""

    @abstractmethod
    def save(self, pending: dict[str, PendingGroup[M]], n: int) -> dict[str, Any]:
        """What the groups generating need beyond their prompts, as plain values; the run that saves continues as
        the run that resumes will."""

    @abstractmethod
    def load(self, state: dict[str, Any], pending: dict[str, PendingGroup[M]], n: int) -> None:
        """`save`'s values for the groups generating, `pending` (their ended members still to come)."""


def _prompts(source: EngineSource, group: PendingGroup[Any]) -> PromptBatch:
    """The group's prompt as a batch of one, its group id its position in the draw."""
    return source.data.batch([group.index], [group.position], source.processor)


class Groups(Generic[M]):
    """One engine's groups as the rollout ranks' program (rollout/remote.py: RolloutServer) and a colocated actor
    (rollout/local.py: LocalRollouts) drive them; the `Producer` of rollout/taken.py."""

    def __init__(
        self,
        source: EngineSource,
        members: Members[M],
        fill: Fill,
        total_steps: int = 1 << 62,
        scores: GroupScores | None = None,
    ) -> None:
        """`scores`: a reward model on ranks of its own scores each group as it completes (rollout/scores.py)."""
        self.source, self.members, self.policy, self.total_steps = source, members, fill, total_steps
        self.runner = members.runner
        self.scores = scores
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
        self.rejection = source.rejection
        self.stale_dropped, self.rejected, self.short = 0, 0, 0
        """Since the last take: groups dropped as too stale, uniform groups dropped (rejection sampling), uniform
        groups kept at weight 0 (the budget of drops was spent)."""
        self.engine_seconds = self.reward_seconds = 0.0
        self.env_mark = members.env_seconds()

    # ---- a step ---------------------------------------------------------------------------------------
    def take(self, step: int) -> TakenGroups:
        """This engine's share of step `step`, relabelled with the engine's positions in the batch: the first
        groups to complete (partial rollouts) or the first drawn (whole batches), within the staleness bound."""
        self.fill(1, step)
        if not self.policy.carry:
            self.ready.sort(key=lambda d: (d.draw, d.position))
        taken, self.ready = self.ready[: self.share], self.ready[self.share :]
        for done, g in zip(taken, self.positions, strict=True):
            self._scores_of(done)
            done.batch.group_ids = torch.full_like(done.batch.group_ids, g)
        if self.scores is not None:
            self.scores.ready(f"take{step}")
        rounds = -(-self.rejected // max(self.share, 1))
        env_now = self.members.env_seconds()
        env, self.env_mark = env_now - self.env_mark, env_now
        out = TakenGroups(
            taken, self.engine_seconds, self.stale_dropped, len(self.runner.live), self.rejected, rounds, self.short,
            self.reward_seconds, env,
        )  # fmt: skip
        self.stale_dropped, self.rejected, self.short = 0, 0, 0
        self.engine_seconds = self.reward_seconds = 0.0
        return out

    def fill(self, batches: int, next_step: int) -> None:
        """Generate until `batches` steps' shares of complete groups are ready, the next taken at `next_step`
        (whole batches: never past the last step, and every draw to its end)."""
        carry = self.policy.carry
        if not carry:
            batches = min(batches, self.total_steps - next_step + 1)
            if batches <= 0:
                return
        else:
            self._top_up(0)
        while True:
            self._drop_stale(next_step)
            need = batches * self.share
            if self.share and len(self.ready) >= need and (carry or not self.pending):
                return
            self._top_up(need)
            if not self.runner.running:  # everything in flight was dropped as stale: more prompts, whatever fits
                self._draw()
            self._step()

    def generate_until(self, arrived: Callable[[], bool], next_step: int) -> int:
        """rollout.update_on_arrival: engine steps until `arrived()` (polled between them), starting new prompts
        while the groups kept in flight allow. Returns the engine steps taken; stops early when nothing is left
        to generate (every group in flight is complete and untaken: the caller waits)."""
        steps = 0
        while not arrived():
            self._drop_stale(next_step)
            self._top_up(0)
            if not self.runner.running:
                break
            self._step()
            steps += 1
        return steps

    def update(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """New weights at an engine-step boundary (rollout ranks); what is in flight goes on under `version`."""
        self.members.stream.update(weights, version)
        self._drop_stale(version + 1)
        if self.scores is not None:
            self.scores.ready(f"update{version}")

    def at_version(self, version: int) -> None:
        """The engine's weights were replaced outside the producer (a colocated sync) while it was suspended."""
        self.members.stream.version = version

    def suspend(self) -> None:
        """Take the requests out of the engine (it sleeps, or validates); the next engine step re-adds them."""
        self.members.stream.suspend()

    # ---- drawing and completing -------------------------------------------------------------------------
    def _step(self) -> None:
        t = time.perf_counter()
        ended = self.runner.advance()
        self.engine_seconds += time.perf_counter() - t
        for rid, member in ended:
            key, j = rid.rsplit(".", 1)
            group = self.pending[key]
            group.done[int(j)] = member
            if len(group.done) == self.n:
                del self.pending[key]
                self._admit(self._scored(group))

    def _scored(self, group: PendingGroup[M]) -> DoneGroup:
        t = time.perf_counter()
        members = [group.done[j] for j in range(self.n)]
        batch = self.members.batch(group, members)
        if not self.source.settings.mixes_rewards:  # else the actor's ranks shape the mixed score (trainer.py)
            shape_scores(batch, self.source.settings.reward, self.source.settings.max_response_length)
        versions = [m.versions for m in members]
        if self.source.masked:
            compact_filter(batch, self.source.masked)
        self.reward_seconds += time.perf_counter() - t
        oldest = min((v for vs in versions for v in vs), default=self.members.stream.version)
        done = DoneGroup(batch, oldest, sum(len(set(vs)) > 1 for vs in versions), group.draw, group.position)
        self._post(done)
        return done

    def _post(self, done: DoneGroup) -> None:
        """A reward model on ranks of its own gets the group's inputs now; rejection sampling reads its scores at
        once (whether the group is admitted), else the step that takes the group does."""
        if self.scores is not None:
            done.ticket = self.scores.post(done.batch.reward_inputs)
            if self.rejection.enable:
                self._scores_of(done)

    def _scores_of(self, done: DoneGroup) -> None:
        if done.ticket is not None and self.scores is not None:
            done.batch.rm_scores = self.scores.get(done.ticket)
            done.ticket = None

    def _admit(self, done: DoneGroup) -> None:
        """A complete group joins the ready ones, except that rejection sampling drops a group whose rewards are
        all equal (no GRPO signal) and another is drawn in its place; at most rejection_sample.max_extra_rounds x
        this engine's share are dropped between two steps, after which a uniform group is kept at weight 0 (it
        leaves every loss and denominator)."""
        if self.rejection.enable and uniform_groups(done.batch, self._admission_scores(done.batch)):
            if self.rejected < self.rejection.max_extra_rounds * max(self.share, 1):
                self.rejected += 1
                return
            done.batch.weights = torch.zeros_like(done.batch.weights)
            self.short += 1
        self.ready.append(done)

    def _admission_scores(self, batch: Batch) -> torch.Tensor | None:
        """The scores rejection sampling reads: the batch's own, or where the actor's ranks mix several sources,
        their mix and shaping as the actor's ranks will compute them (the sources here: the rule, the judge; the
        validation refuses rejection sampling with a trained reward model, scored only at the step)."""
        settings = self.source.settings
        if not settings.mixes_rewards:
            return None
        weights = {k: w for k, w in settings.reward_weights.items() if w}
        # a copy of the fields mixing and shaping write: the trainer mixes the batch itself
        mixed = replace(batch, step_rewards=None, reward_extra=dict(batch.reward_extra))
        mix_scores(
            mixed, weights, settings.reward_combine, settings.reward, settings.max_response_length, batch.rm_scores
        )
        return mixed.scores

    def _top_up(self, need: int) -> None:
        """Partial rollouts: draw another share while it fits in the groups kept in flight (always when idle).
        Whole batches: draw a share when the last one is complete and `need` groups are not ready."""
        if not self.policy.carry:
            if not self.pending and (not self.share or len(self.ready) < need):
                self._draw()
            return
        while not self.share or len(self.pending) + len(self.ready) + self.share <= self.policy.per_engine:
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
            self.members.start(key, self.pending[key], self.n)

    def _drop_stale(self, next_step: int) -> None:
        """Drop what would exceed trainer.max_staleness when taken at `next_step` or later: complete groups, and
        groups still generating whose oldest token is already too old (their members are stopped)."""
        bound = self.policy.max_staleness
        if bound is None:
            return
        oldest_allowed = (next_step - 1) - bound
        kept = [d for d in self.ready if d.oldest >= oldest_allowed]
        self.stale_dropped += len(self.ready) - len(kept)
        self.ready = kept
        for key, group in list(self.pending.items()):
            running = [f"{key}.{j}" for j in range(self.n) if j not in group.done]
            versions = [v for m in group.done.values() for v in m.versions]
            versions += [v for rid in running if (v := self.runner.oldest(rid)) is not None]
            if versions and min(versions) < oldest_allowed:
                self.runner.drop(running)
                del self.pending[key]
                self.stale_dropped += 1

    # ---- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain values: the sampler's position, the draws, the groups generating (what their members need: the
        members' own format) and the complete ones."""
        members = self.members.save(self.pending, self.n)
        return {
            "partial_rollout": self.policy.carry,
            "sampler": self.source.sampler.state_dict(),
            "draws": self.draws,
            "share": self.share,
            "positions": list(self.positions),
            "counts": [self.rejected, self.short],
            "ready": [
                {"batch": d.batch.to_wire(), "at": [d.oldest, d.partial, d.draw, d.position]}
                | ({"unscored": True} if d.ticket is not None else {})
                for d in self.ready
            ],
            "version": self.members.stream.version,
            "pending": [
                {"key": k, "index": g.index, "position": g.position, "draw": g.draw} for k, g in self.pending.items()
            ],
            "members": members,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state saved with the same rollout.partial_rollout (a checkpoint from before the key was saved is
        taken as it is): the other mode's groups in flight and batches ready are not this one's."""
        state = _current_layout(state)
        saved = state.get("partial_rollout")
        if isinstance(saved, bool) and saved != self.policy.carry:
            raise partial_rollout_changed(saved, self.policy.carry)
        self.source.sampler.load_state_dict(state["sampler"])
        self.draws, self.share = int(state["draws"]), int(state["share"])
        self.positions = [int(p) for p in state["positions"]]
        self.rejected, self.short = (int(c) for c in state["counts"])
        self.ready = [DoneGroup(Batch.from_wire(d["batch"]), *(int(v) for v in d["at"])) for d in state["ready"]]
        for done, d in zip(self.ready, state["ready"], strict=True):
            if d.get("unscored") and self.scores is not None:  # its scores had not come: posted again
                done.ticket = self.scores.post(done.batch.reward_inputs)
        self.pending = {
            g["key"]: PendingGroup(int(g["index"]), int(g["position"]), int(g["draw"])) for g in state["pending"]
        }
        self.members.stream.version = int(state["version"])
        self.members.load(state["members"], self.pending, self.n)


def _current_layout(state: dict[str, Any]) -> dict[str, Any]:
    """A producer state as `Groups.state_dict` writes it. Checkpoints before 2026-11-30 kept the stream's version
    and the groups generating in the members' part, with each group's finished samples beside it."""
    if "pending" in state:
        return state
    old = state["members"]
    done = {g["key"]: g["done"] for g in old["pending"] if "done" in g}
    members = {"done": done, "live": old["live"]} if "live" in old else {}
    return state | {"version": old["version"], "pending": old["pending"], "members": members}


class Samples(Members[InflightSample]):
    """Members that are single samples: one request each, seeded by the group's position and the sample's index,
    with the prompt's images; a group is scored by the reward function when its last sample finishes."""

    def __init__(self, source: EngineSource, stream: InflightStream, carry: bool) -> None:
        """`carry`: the requests report their tokens at each engine step (partial rollouts), else at their end."""
        self.source, self.stream, self.carry = source, stream, carry
        self.runner = stream

    def start(self, key: str, group: PendingGroup[InflightSample], n: int) -> None:
        prompt = self.source.data.prompt_ids[group.index]
        params = self.source.sampling(group.draw, validation=False)
        for j in range(n):
            one = replace(params, n=1, sample=j, progress=self.carry)
            self.stream.add(f"{key}.{j}", prompt, one, group.position, self._images(group.index))

    def _images(self, index: int) -> list[Any]:
        """The images of the training set's row `index` (none for a text-only model)."""
        return self.source.data.images[index] if self.source.data.images else []

    def batch(self, group: PendingGroup[InflightSample], members: list[InflightSample]) -> Batch:
        prompts = _prompts(self.source, group)
        routes = [s.routes for s in members if s.routes is not None]  # recorded for all or none
        gen = Generation(
            [s.tokens for s in members],
            [s.logprobs for s in members],
            [s.finish_reason or "length" for s in members],
            routed_experts=routes or None,
        )
        n = len(members)
        batch = collate(prompts, gen, n, self.source.pad_id, self.source.vision)
        batch.behavior_versions = version_rows([s.versions for s in members], batch.response_width)
        self.source.scoring.score(batch, prompts, n)
        return batch

    def save(self, pending: dict[str, PendingGroup[InflightSample]], n: int) -> dict[str, Any]:
        """The groups generating with their finished samples, and the requests in flight; those are re-added here
        (as after a resume), so the run that saves continues exactly as the run that resumes from it: with an
        empty prefix cache, as a new engine's (the plan caches a group's prompt once for its n samples)."""
        self.stream.suspend()
        self.source.engine.reset_prefix_cache()  # nothing runs now; the weights' salt keeps what it cannot free
        done = {key: {str(j): sample_state(s) for j, s in g.done.items()} for key, g in pending.items()}
        return {"done": done, "live": self.stream.export()}

    def load(self, state: dict[str, Any], pending: dict[str, PendingGroup[InflightSample]], n: int) -> None:
        for key, done in state["done"].items():
            pending[key].done = {int(j): sample_from_state(s) for j, s in done.items()}
        self.stream.adopt(state["live"])
        for rid, s in self.stream.live.items():  # the images are the data set's, not the state's
            s.images = self._images(pending[rid.rsplit(".", 1)[0]].index)


class EpisodeMembers(Members[Trajectory]):
    """Members that are agent episodes (rollout/episodes.py), run turn by turn; a group is made into a batch as
    agent batches are (one row per trajectory, or per turn with `stepwise`), its rewards the environments'. A
    checkpoint restarts the groups still generating from their first turn, in the run that saves as in the run that
    resumes (docs/async.md: exact with agent.env_workers=0)."""

    def __init__(self, source: EngineSource, episodes: Episodes, stepwise: bool) -> None:
        """`stepwise`: a row per turn (algorithm.stepwise_advantage), else one per trajectory."""
        self.source, self.episodes, self.stepwise = source, episodes, stepwise
        self.runner, self.stream = episodes, episodes.stream

    def env_seconds(self) -> float:
        return self.episodes.loop.env_seconds

    def start(self, key: str, group: PendingGroup[Trajectory], n: int) -> None:
        """The group's episodes from their first turn, seeded by its position and episode index."""
        prompts = _prompts(self.source, group)
        ((uid, task),) = episode_tasks(prompts)
        starts = [(f"{key}.{j}", uid, task, j * EPISODE_SEED + uid) for j in range(n)]
        self.episodes.start(starts, self.source.sampling(group.draw, validation=False))

    def batch(self, group: PendingGroup[Trajectory], members: list[Trajectory]) -> Batch:
        """The group's rows, scored by the environments; a reward model and a judge read each trajectory's
        transcript (every response and observation after the first prompt, special tokens dropped) as its
        response (not with `stepwise`: the validation refuses the pair)."""
        pad_id = self.source.pad_id
        if self.stepwise:
            return steps_to_batch(members, pad_id)
        batch = trajectories_to_batch(members, pad_id)
        if self.source.scoring.models:
            tok = self.source.tokenizer
            texts = [tok.decode(t.response_tokens()[0], skip_special_tokens=True) for t in members]
            prompts = _prompts(self.source, group)
            self.source.scoring.models_inputs(batch, prompts, texts, [0] * len(members))
        return batch

    def save(self, pending: dict[str, PendingGroup[Trajectory]], n: int) -> dict[str, Any]:
        """The groups still running, restarted here from their first turn (as the run that resumes restarts them)."""
        if pending:
            self.episodes.drop([f"{key}.{j}" for key in pending for j in range(n)])
            self.episodes.forget_cache()
            for key, group in pending.items():
                group.done = {}
                self.start(key, group, n)
        return {}

    def load(self, state: dict[str, Any], pending: dict[str, PendingGroup[Trajectory]], n: int) -> None:
        for key, group in pending.items():
            self.start(key, group, n)
