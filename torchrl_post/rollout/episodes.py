"""Episodes in flight: episodes advanced one engine step at a time, each turn a request of `rollout/inflight.py`'s
stream, so that they can be carried across weight updates (rollout/groups.py) or run to their end (agent/loop.py:
`AgentLoop.run`). What a turn is (its prompt, the answer to a response, when an episode ends) is the turn logic's,
`Turns`: agent/loop.py's `AgentLoop` (environments and tools, many turns) or `OneTurn` (a plain prompt: one turn,
scored by the producer at its end). This module steps them, collects the answers that arrived, enforces the wall
clock, and stops, suspends or updates what is in flight.

    episodes = Episodes(OneTurn(progress=True), stream)      # or loop.episodes(): agent episodes
    episodes.start([(episode_id, uid, task, sample), ...], params)
    while episodes.running:
        for episode_id, trajectory in episodes.advance():   # the episodes that ended in this engine step
            ...
        episodes.stream.update(weights, version)             # between two engine steps (streamed)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any, Protocol

from torchrl_post.agent.base import Step, Trajectory
from torchrl_post.engines.base import SamplingParams
from torchrl_post.rollout.inflight import InflightStream

EPISODE_SEED = 1_000_003
"""Episode k of a task with uid u starts from seed uid k * EPISODE_SEED + u (turn t adds 7919 t)."""


@dataclass
class Live:
    traj: Trajectory
    env: Any
    """The episode's environment (agent/base.py: Env)."""
    context: list[int]
    seed_uid: int
    started: float
    """`Episodes.clock` when it started."""
    params: SamplingParams
    """The episode's sampling parameters (each turn's budget is set from them)."""
    turn: int = 0
    used: int = 0  # response tokens so far


Request = tuple[list[int], SamplingParams, int, list[Any] | None]
"""A turn's request: its prompt, its parameters, its seed uid and the prompt's images (or None)."""


class Turns(Protocol):
    """The turn logic `Episodes` drives: agent/loop.py's `AgentLoop`, or `OneTurn`."""

    env_workers: int
    """Threads for the environments' answers (0: inline)."""
    turn_batches: bool
    """Wait for every episode's turn before the next ones go (a per-turn batch, for comparison)."""
    env_seconds: float
    """Seconds the environments' answers took so far."""

    @property
    def timeout_s(self) -> float:
        """An episode's wall clock (of `advance` calls)."""
        ...

    def begin(self, uid: int, task: dict[str, Any], sample: int, params: SamplingParams) -> Live | Trajectory:
        """Episode `sample` of a task: live, or already ended (a Trajectory with its termination)."""
        ...

    def request(self, s: Live) -> Request: ...

    def answer_async(self, pool: ThreadPoolExecutor | None, env: Any, ids: list[int]) -> Future[Any]:
        """The answer to a response (on a worker thread where `pool`)."""
        ...

    def answered(self, s: Live, step: Step, answer: Any) -> str | None:
        """Record the answer to a turn; why the episode ends, or None when it goes on."""
        ...


class OneTurn:
    """A plain prompt as an episode of one turn: task["prompt_ids"] (and task["images"]), sample j seeded as vLLM
    seeds an n-sample request's j-th (the task's uid, `SamplingParams.sample`); it ends with the engine's finish
    reason and is scored by whoever collects it (rollout/groups.py)."""

    env_workers, turn_batches, env_seconds, timeout_s = 0, False, 0.0, math.inf

    def __init__(self, progress: bool) -> None:
        """`progress`: the requests report their tokens at each engine step (partial rollouts), else at their end."""
        self.progress = progress

    def begin(self, uid: int, task: dict[str, Any], sample: int, params: SamplingParams) -> Live:
        ids = list(task["prompt_ids"])
        traj = Trajectory(uid, task, prompt=ids)
        return Live(traj, None, ids, uid, 0.0, replace(params, n=1, sample=sample, progress=self.progress))

    def request(self, s: Live) -> Request:
        return s.context, s.params, s.seed_uid, s.traj.task.get("images") or None

    def answer_async(self, pool: ThreadPoolExecutor | None, env: Any, ids: list[int]) -> Future[Any]:
        fut: Future[Any] = Future()
        fut.set_result(None)
        return fut

    def answered(self, s: Live, step: Step, answer: Any) -> str:
        return step.finish_reason or "length"


class Episodes:
    """Episodes in flight over an `InflightStream` (the module docstring says how to drive them)."""

    def __init__(self, loop: Turns, stream: InflightStream, agree: Callable[[Any], Any] = lambda v: v) -> None:
        self.loop, self.stream, self.agree = loop, stream, agree
        self.live: dict[str, Live] = {}
        self.queued: list[str] = []
        """Episodes ready for their next turn."""
        self.pending: dict[Future[Any], tuple[str, Step]] = {}
        """Turns waiting for their environment's (or tools') answer."""
        self.ended: list[tuple[str, Trajectory]] = []
        self.clock = 0.0
        """Seconds spent advancing the episodes: agent.timeout_s counts these, not the waits between two calls
        (a streamed episode waits for the trainer's updates)."""
        self._since = 0.0
        n = loop.env_workers
        self.pool = ThreadPoolExecutor(n, thread_name_prefix="agent-env") if n else None

    @property
    def running(self) -> bool:
        """Episodes are live, or ended and not yet returned by `advance`."""
        return bool(self.live or self.ended)

    def start(self, episodes: list[tuple[str, int, dict[str, Any], int]], params: SamplingParams) -> None:
        """New episodes (id, uid, task, episode index in its group), reset now; their first turns go to the engine
        at the next `advance`, except a turn already in the stream (adopted from a checkpoint). An episode whose
        reset fails ends at once."""
        for rid, uid, task, sample in episodes:
            state = self.loop.begin(uid, task, sample, params)
            if isinstance(state, Trajectory):
                self.ended.append((rid, state))
            else:
                state.started = self.clock
                self.live[rid] = state
                if rid not in self.stream.live:
                    self.queued.append(rid)

    def advance(self) -> list[tuple[str, Trajectory]]:
        """Send the next turns, one engine step (or a short wait for an answer), then the environments' answers
        that arrived; returns the episodes that ended, in the order they ended."""
        self._since = time.perf_counter()
        if self.queued and (not self.loop.turn_batches or not (self.stream.live or self.pending)):
            for rid in self.queued:
                self.stream.add(rid, *self.loop.request(self.live[rid]))
            self.queued.clear()
        self._check_timeouts()
        if self.stream.live:
            for sample in self.stream.step():
                s = self.live[sample.request_id]
                step = Step(list(s.context), sample.tokens, sample.logprobs, versions=sample.versions)
                step.routes, step.finish_reason = sample.routes, sample.finish_reason
                s.traj.steps.append(step)
                fut = self.loop.answer_async(self.pool, s.env, sample.tokens)
                self.pending[fut] = (sample.request_id, step)
        elif self.pending:
            wait(list(self.pending), timeout=0.05, return_when=FIRST_COMPLETED)
        self._collect()
        self.clock += time.perf_counter() - self._since
        out, self.ended = self.ended, []
        return out

    def _collect(self) -> None:
        """The answers that arrived: each episode ends or queues its next turn."""
        by_id = {rid: fut for fut, (rid, _) in self.pending.items()}
        for rid in self.agree([rid for rid, fut in by_id.items() if fut.done()]):
            fut = by_id[rid]
            answer = fut.result()  # (a mirrored rank may not have its answer yet: it waits for it)
            _, step = self.pending.pop(fut)
            if rid in self.live:  # not already timed out
                end = self.loop.answered(self.live[rid], step, answer)
                if end is None:
                    self.queued.append(rid)
                else:
                    self._end(rid, end)

    def drop(self, episode_ids: list[str]) -> None:
        """Stop these episodes for good: their turns in flight are aborted, their answers abandoned."""
        gone = set(episode_ids)
        self._abandon(episode_ids)
        self.ended = [(rid, t) for rid, t in self.ended if rid not in gone]
        for rid in gone:
            self.live.pop(rid, None)

    def _abandon(self, episode_ids: list[str]) -> None:
        """Abort these episodes' turns in flight, cancel their environment calls, unqueue their next turns."""
        gone = set(episode_ids)
        self.stream.drop([rid for rid in episode_ids if rid in self.stream.live])
        for fut in [f for f, (rid, _) in self.pending.items() if rid in gone]:
            fut.cancel()
            del self.pending[fut]
        self.queued = [rid for rid in self.queued if rid not in gone]

    def forget_cache(self) -> None:
        """Clear the engine's prefix cache (nothing may be in flight): a run that restarts here from a checkpoint
        starts with an empty one, and blocks computed by earlier weights would serve the restarted turns."""
        assert not self.stream.live, "the engine's requests hold their cached blocks"
        self.stream.engine.reset_prefix_cache()  # what it cannot free, the weights' salt keeps unread (engines/vllm.py)

    def oldest(self, episode_id: str) -> int | None:
        """The oldest policy version among a live episode's tokens so far (None: not live, or none generated yet)."""
        if episode_id not in self.live:
            return None
        versions = self.live[episode_id].traj.versions
        if episode_id in self.stream.live:
            versions += self.stream.live[episode_id].versions
        return min(versions, default=None)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def _check_timeouts(self) -> None:
        """Past the wall clock (of `advance` calls): abort the turn (its tokens so far become a last step) or abandon the
        environment call; the trajectory ends with `timeout`."""
        if math.isinf(self.loop.timeout_s):
            return
        now = self.clock + time.perf_counter() - self._since
        late = self.agree([rid for rid, s in self.live.items() if now - s.started > self.loop.timeout_s])
        if not late:
            return
        for rid in late:
            turn = self.stream.live.get(rid)
            if turn is not None and turn.tokens:
                s = self.live[rid]
                s.traj.steps.append(
                    Step(list(s.context), list(turn.tokens), list(turn.logprobs), versions=turn.versions)
                )
        self._abandon(late)
        for rid in late:
            self._end(rid, "timeout")

    def _end(self, rid: str, termination: str) -> None:
        s = self.live.pop(rid)
        s.traj.termination = termination
        s.traj.reward = sum(step.reward for step in s.traj.steps)
        self.ended.append((rid, s.traj))
