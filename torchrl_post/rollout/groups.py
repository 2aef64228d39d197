"""The one rollout producer: an engine's prompt groups, drawn in its share of the sampler's batches, generated member
by member, scored when the last member ends, admitted (rejection sampling), and taken by the steps. A member is an
episode (rollout/episodes.py): a plain prompt's one turn, or an agent's turns (agent/loop.py). How far ahead, and
whether unfinished members survive an update, is the run plan's fill policy (`rollout.taken.Fill`), which this class
only reads:

    groups = Groups(source, fill)          # the source's agent loop, if it has one, makes its members' turns
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from torchrl_post.agent.base import Step, Trajectory, steps_to_batch, trajectories_to_batch
from torchrl_post.checkpoint.dcp import partial_rollout_changed
from torchrl_post.engines.batch import collate, version_rows
from torchrl_post.engines.lockstep import Lockstep
from torchrl_post.reward.mixing import mix_scores
from torchrl_post.reward.shaping import shape_scores
from torchrl_post.rollout.episodes import Episodes, OneTurn
from torchrl_post.rollout.filters import compact_filter, uniform_groups
from torchrl_post.rollout.inflight import InflightStream
from torchrl_post.rollout.scores import GroupScores
from torchrl_post.rollout.source import EngineSource, episode_tasks
from torchrl_post.rollout.taken import DoneGroup, Fill, TakenGroups
from torchrl_post.types import Batch, Generation, PromptBatch


@dataclass
class PendingGroup:
    """A prompt's group while its members generate."""

    index: int
    """Its row in the training set."""
    position: int
    """Its position in the draw's batch (with the draw, its members' seeds)."""
    draw: int
    done: dict[int, Trajectory] = field(default_factory=dict)
    """Ended members by their index in the group."""


def _prompts(source: EngineSource, group: PendingGroup) -> PromptBatch:
    """The group's prompt as a batch of one, its group id its position in the draw."""
    return source.data.batch([group.index], [group.position], source.processor)


class Groups:
    """One engine's groups as the rollout ranks' program (rollout/remote.py: RolloutServer) and a colocated actor
    (rollout/local.py: LocalRollouts) drive them."""

    def __init__(
        self, source: EngineSource, fill: Fill, total_steps: int = 1 << 62, scores: GroupScores | None = None
    ) -> None:
        """`scores`: a reward model on ranks of its own scores each group as it completes (rollout/scores.py). The
        ranks of a tensor-parallel engine run the same groups: every add and abort checked alike at each engine step
        (engines/lockstep.py)."""
        self.source, self.policy, self.total_steps = source, fill, total_steps
        self.agent = source.loop
        if self.agent is not None:
            self.episodes = self.agent.episodes(fill.recompute, mirrored=True)
        else:
            stream = InflightStream(Lockstep(source.engine, source.engine_group), fill.recompute)
            self.episodes = Episodes(OneTurn(progress=fill.carry), stream)
        self.stream = self.episodes.stream
        """The requests in flight; the next generated tokens come from its version."""
        self.scores = scores
        self.n = source.settings.group_size
        """Members per group (rollout.n)."""
        self.draws = 0
        self.pending: dict[str, PendingGroup] = {}
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
        self.env_mark = self.episodes.loop.env_seconds

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
        env_now = self.episodes.loop.env_seconds
        env, self.env_mark = env_now - self.env_mark, env_now
        out = TakenGroups(
            taken, self.engine_seconds, self.stale_dropped, len(self.episodes.live), self.rejected, rounds, self.short,
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
            if not self.episodes.running:  # everything in flight was dropped as stale: more prompts, whatever fits
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
            if not self.episodes.running:
                break
            self._step()
            steps += 1
        return steps

    def update(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """New weights at an engine-step boundary (rollout ranks); what is in flight goes on under `version`."""
        self.stream.update(weights, version)
        self._drop_stale(version + 1)
        if self.scores is not None:
            self.scores.ready(f"update{version}")

    def at_version(self, version: int) -> None:
        """The engine's weights were replaced outside the producer (a colocated sync) while it was suspended."""
        self.stream.version = version

    def suspend(self) -> None:
        """Take the requests out of the engine (it sleeps, or validates); the next engine step re-adds them."""
        self.stream.suspend()

    # ---- drawing and completing -------------------------------------------------------------------------
    def _step(self) -> None:
        t = time.perf_counter()
        ended = self.episodes.advance()
        self.engine_seconds += time.perf_counter() - t
        for rid, member in ended:
            key, j = rid.rsplit(".", 1)
            group = self.pending[key]
            group.done[int(j)] = member
            if len(group.done) == self.n:
                del self.pending[key]
                self._admit(self._scored(group))

    def _scored(self, group: PendingGroup) -> DoneGroup:
        t = time.perf_counter()
        members = [group.done[j] for j in range(self.n)]
        batch = self._batch(group, members)
        if not self.source.settings.mixes_rewards:  # else the actor's ranks shape the mixed score (trainer.py)
            shape_scores(batch, self.source.settings.reward, self.source.settings.max_response_length)
        versions = [m.versions for m in members]
        if self.source.masked:
            compact_filter(batch, self.source.masked)
        self.reward_seconds += time.perf_counter() - t
        oldest = min((v for vs in versions for v in vs), default=self.stream.version)
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
            self._start(key, self.pending[key])

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
            versions += [v for rid in running if (v := self.episodes.oldest(rid)) is not None]
            if versions and min(versions) < oldest_allowed:
                self.episodes.drop(running)
                del self.pending[key]
                self.stale_dropped += 1

    # ---- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain values: the sampler's position, the draws, the groups generating (what their members need: the
        members' own format) and the complete ones."""
        members = self._save_members()
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
            "version": self.stream.version,
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
        self.stream.version = int(state["version"])
        self._load_members(state["members"])

    # ---- members: a plain prompt's one turn or an agent's episode ------------------------------------------
    def _start(self, key: str, group: PendingGroup) -> None:
        """The group's members from their beginning, seeded by its position and their index in it (a turn
        adopted from a checkpoint goes on instead)."""
        if self.agent is not None:
            ((uid, task),) = episode_tasks(_prompts(self.source, group))
        else:  # the prompt's ids as the data set holds them (no batch built, no image processed)
            uid, task = group.position, {"prompt_ids": self.source.data.prompt_ids[group.index]}
            task["images"] = self._images(group.index)
        starts = [(f"{key}.{j}", uid, task, j) for j in range(self.n) if j not in group.done]
        self.episodes.start(starts, self.source.sampling(group.draw, validation=False))

    def _images(self, index: int) -> list[Any]:
        """The images of the training set's row `index` (none for a text-only model)."""
        return self.source.data.images[index] if self.source.data.images else []

    def _batch(self, group: PendingGroup, members: list[Trajectory]) -> Batch:
        """The complete group as a scored batch. Plain prompts: collated as a whole batch is, scored by the reward
        function. Agent episodes: a row per trajectory (or per turn, `stepwise`), scored by the environments; a
        reward model and a judge read each trajectory's transcript (every response and observation after the first
        prompt, special tokens dropped) as its response (not with `stepwise`: the validation refuses the pair)."""
        source, prompts, n = self.source, _prompts(self.source, group), len(members)
        if self.agent is None:
            turns = [t.steps[0] for t in members]
            routes = [s.routes for s in turns if s.routes is not None]  # recorded for all or none
            gen = Generation(
                [s.response_ids for s in turns],
                [s.logprobs for s in turns],
                [s.finish_reason or "length" for s in turns],
                routed_experts=routes or None,
            )
            batch = collate(prompts, gen, n, source.pad_id, source.vision)
            batch.behavior_versions = version_rows([s.versions for s in turns], batch.response_width)
            source.scoring.score(batch, prompts, n)
            return batch
        if source.stepwise:
            return steps_to_batch(members, source.pad_id)
        batch = trajectories_to_batch(members, source.pad_id)
        if source.scoring.models:
            texts = [source.tokenizer.decode(t.response_tokens()[0], skip_special_tokens=True) for t in members]
            source.scoring.models_inputs(batch, prompts, texts, [0] * n)
        return batch

    def _save_members(self) -> dict[str, Any]:
        """What the groups generating need beyond their prompts, as plain values, so that the run that saves goes
        on exactly as the run that resumes from it. Plain prompts: each finished turn, and the requests in flight,
        re-added here (as after a resume) with an empty prefix cache, as a new engine's. Agent episodes: none; the
        groups still running restart here from their first turn, as in the run that resumes (docs/async.md: exact
        with agent.env_workers=0)."""
        if self.agent is not None:
            if self.pending:
                self.episodes.drop([f"{key}.{j}" for key in self.pending for j in range(self.n)])
                self.episodes.forget_cache()
                for key, group in self.pending.items():
                    group.done = {}
                    self._start(key, group)
            return {}
        self.stream.suspend()
        self.source.engine.reset_prefix_cache()  # nothing runs now; the weights' salt keeps what it cannot free
        done = {key: {str(j): _turn_state(t) for j, t in g.done.items()} for key, g in self.pending.items()}
        return {"done": done, "live": self.stream.export()}

    def _load_members(self, state: dict[str, Any]) -> None:
        """`_save_members`' values for the groups generating (`pending`)."""
        if self.agent is None:
            for key, done in state["done"].items():
                group = self.pending[key]
                prompt = self.source.data.prompt_ids[group.index]
                group.done = {int(j): _turn(group.position, prompt, t) for j, t in done.items()}
            self.stream.adopt(state["live"])
            for rid, s in self.stream.live.items():  # the images are the data set's, not the state's
                s.images = self._images(self.pending[rid.rsplit(".", 1)[0]].index)
        for key, group in self.pending.items():
            self._start(key, group)


def _turn_state(t: Trajectory) -> dict[str, Any]:
    """A plain prompt's finished turn as plain values (the fields of inflight.py's `sample_state` it needs)."""
    s = t.steps[0]
    state = {"tokens": s.response_ids, "logprobs": s.logprobs, "versions": s.versions, "finish_reason": s.finish_reason}
    return state | ({"routes": s.routes} if s.routes is not None else {})


def _turn(uid: int, prompt: list[int], state: dict[str, Any]) -> Trajectory:
    step = Step(list(prompt), list(state["tokens"]), list(state["logprobs"]), versions=list(state["versions"]))
    step.finish_reason, step.routes = state["finish_reason"], state.get("routes")
    return Trajectory(uid, {}, [step], list(prompt), termination=step.finish_reason or "length")


def _current_layout(state: dict[str, Any]) -> dict[str, Any]:
    """A producer state as `Groups.state_dict` writes it. Checkpoints before 2026-11-30 kept the stream's version
    and the groups generating in the members' part, with each group's finished samples beside it."""
    if "pending" in state:
        return state
    old = state["members"]
    done = {g["key"]: g["done"] for g in old["pending"] if "done" in g}
    members = {"done": done, "live": old["live"]} if "live" in old else {}
    return state | {"version": old["version"], "pending": old["pending"], "members": members}
