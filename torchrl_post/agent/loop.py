"""The agent loop's turn logic: an episode's start, each turn's request, the
environment's or the tools' answer to a response, and when the episode ends. `Episodes` (`loop.episodes()`) steps
many at once on the in-process engine, each turn added as soon as the previous one was answered; `run` drives them
to their end (validation); training rollouts are groups of episodes (rollout/groups.py).

    loop = AgentLoop(engine, tokenizer, make_env, agent, limits, tools=box, parse_calls=parser)
    trajectories = loop.run([(uid, task), ...], params)      # n trajectories per task when params.n > 1

Environments and tools run on `env_workers` threads (0: inline, which makes the engine's batches reproducible).
Token in, token out (agent/chat.py). A response that calls tools (`parse_calls`, e.g. hermes `<tool_call>`) gets
their results as its observation; any other is the agent's action for `env.step`. Limits end only their own
trajectory: `max_turns`, `length`, `max_prompt_length`, `timeout` (an environment call that hangs is abandoned on its
thread) and `error`. Seeds are per (uid, sample, turn).

A tensor-parallel engine (`group`) stays in lockstep through engines/lockstep.py: in `run` the first rank leads
and the others follow; streamed episodes (`episodes(mirrored=True)`) run on every rank, which take the first rank's
view of the answers that arrived and the turns that ran out of time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch.distributed as dist

from torchrl_post.agent.base import Agent, Env, Step, Trajectory
from torchrl_post.agent.chat import observation_delta, prompt_ids
from torchrl_post.engines.base import SamplingParams
from torchrl_post.engines.lockstep import Lockstep, agreed
from torchrl_post.rollout.episodes import EPISODE_SEED, Episodes, Live, Request
from torchrl_post.rollout.inflight import InflightStream
from torchrl_post.tools import ToolBox

log = logging.getLogger(__name__)

ParseCalls = Callable[[str], tuple[bool, list[tuple[str, str]]]]


@dataclass(frozen=True)
class LoopLimits:
    max_turns: int = 4
    max_response_length: int = 64
    """Response tokens of a whole trajectory (its turns together)."""
    max_model_len: int = 256
    """Context the engine holds: prompt, responses and observations."""
    timeout_s: float = 60.0
    """Wall clock per trajectory."""
    max_tokens_per_turn: int = 0
    """Response tokens of one turn; 0: only the trajectory's budget limits it."""


@dataclass
class _Answer:
    """What the environment or the tools made of one response (computed on a worker thread)."""

    messages: list[dict[str, str]] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    failed: bool = False
    action: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    tool_calls: int = 0
    tool_errors: int = 0
    seconds: float = 0.0


class AgentLoop:
    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        make_env: Callable[[], Env],
        agent: Agent,
        limits: LoopLimits,
        *,
        tools: ToolBox | None = None,
        parse_calls: ParseCalls | None = None,
        env_workers: int = 32,
        group: dist.ProcessGroup | None = None,
        turn_batches: bool = False,
    ) -> None:
        """`turn_batches`: wait for every trajectory's turn before starting the next ones (one batch per
        turn, as a per-turn `generate` loop does; for comparison)."""
        self.engine, self.tokenizer, self.make_env, self.agent, self.limits = engine, tokenizer, make_env, agent, limits
        self.tools, self.parse_calls = tools, parse_calls
        self.tool_schemas = tools.schemas() if tools is not None else None
        self.env_workers, self.group, self.turn_batches = env_workers, group, turn_batches
        self.eos_id = tokenizer.eos_token_id
        self.env_seconds = 0.0
        # The one tensor-parallel mechanism (engines/lockstep.py): the first rank leads a batch and the others follow
        # it (`run`), or every rank runs the same streamed episodes (`episodes(mirrored=True)`).
        self._lead_lock = Lockstep(engine, group, mirrored=False)
        self._mirror_lock = Lockstep(engine, group, mirrored=True)

    # ---- entry ----------------------------------------------------------------------------------------
    @property
    def timeout_s(self) -> float:
        return self.limits.timeout_s

    @property
    def engine_steps(self) -> int:
        """Engine steps taken by this rank's loop."""
        return self._lead_lock.steps + self._mirror_lock.steps

    def run(self, tasks: list[tuple[int, dict[str, Any]]], params: SamplingParams) -> list[Trajectory]:
        """`params.n` trajectories per task, in task-major order. On a tensor-parallel engine every rank
        calls it; the first rank's `tasks` are the ones run, and every rank returns the same trajectories."""
        trajectories: list[Trajectory] = []
        if self._lead_lock.leader:
            trajectories = self._lead(tasks, params)
            self._lead_lock.finish()
        else:
            self._lead_lock.follow()  # apply the first rank's adds and aborts, step with it
        return agreed(trajectories, self.group)

    # ---- the first (or only) rank ---------------------------------------------------------------------
    def episodes(self, recompute: bool = False, mirrored: bool = False) -> Episodes:
        """Episodes driven engine step by engine step over this loop's engine; an update between two engine steps
        keeps their KV cache or (`recompute`) re-prefills them. `mirrored`: every rank of a tensor-parallel engine
        runs them (streamed groups), taking the first rank's view of what arrived and what ran out of time
        (engines/lockstep.py: agreed), so their requests stay alike."""
        if mirrored:
            return Episodes(self, InflightStream(self._mirror_lock, recompute), lambda v: agreed(v, self.group))
        return Episodes(self, InflightStream(self._lead_lock, recompute))

    def _lead(self, tasks: list[tuple[int, dict[str, Any]]], params: SamplingParams) -> list[Trajectory]:
        episodes = self.episodes()
        starts = [(f"{uid}-{k}", uid, task, k) for uid, task in tasks for k in range(params.n)]
        done: dict[str, Trajectory] = {}
        try:
            episodes.start(starts, params)
            while episodes.running:
                done.update(episodes.advance())
        finally:
            episodes.close()
        return [done[rid] for rid, *_ in starts]

    def begin(self, uid: int, task: dict[str, Any], sample: int, params: SamplingParams) -> Live | Trajectory:
        """Episode `sample` of a task, reset: live, or ended (its reset failed, its prompt is too long)."""
        traj = Trajectory(uid, task)
        try:
            env = self.make_env()
            obs = self._timed(env.reset, task)
            context = prompt_ids(self.tokenizer, self.agent.initial_messages(task, obs), self.tool_schemas)
            traj.prompt = list(context)
        except Exception as e:  # a user's environment may raise anything: only this trajectory ends
            log.warning("agent: environment reset failed: %r", e)
            traj.termination = "error"
            return traj
        if len(context) + 1 > self.limits.max_model_len:
            traj.termination = "max_prompt_length"
            return traj
        return Live(traj, env, context, sample * EPISODE_SEED + uid, 0.0, params)

    def request(self, s: Live) -> Request:
        """The next turn's request: its prompt, its parameters (the token budget left) and its seed uid."""
        budget = min(self.limits.max_response_length - s.used, self.limits.max_model_len - len(s.context))
        if self.limits.max_tokens_per_turn:
            budget = min(budget, self.limits.max_tokens_per_turn)
        turn_params = replace(s.params, n=1, max_tokens=max(1, min(s.params.max_tokens, budget)))
        return list(s.context), turn_params, s.seed_uid + 7919 * s.turn, None

    # ---- a finished turn ---------------------------------------------------------------------------------
    def answer_async(self, pool: ThreadPoolExecutor | None, env: Env, ids: list[int]) -> Future[_Answer]:
        """The environment's (or the tools') answer to a response, on a worker thread. The text is decoded
        here: tokenizers are not shared across threads."""
        raw = self.tokenizer.decode(ids, skip_special_tokens=False) if self.tools is not None else ""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if pool is not None:
            return pool.submit(self._answer, env, raw, text)
        fut: Future[_Answer] = Future()
        fut.set_result(self._answer(env, raw, text))
        return fut

    def _answer(self, env: Env, raw: str, text: str) -> _Answer:
        t = time.perf_counter()
        out = _Answer()
        try:
            tried, calls = self.parse_calls(raw) if self.tools is not None and self.parse_calls else (False, [])
            if tried:
                assert self.tools is not None
                out.tool_calls = len(calls) or 1
                if not calls:
                    out.messages = [{"role": "tool", "content": "error: malformed tool call (expected JSON)"}]
                    out.tool_errors = 1
                for name, arguments in calls:
                    result, ok = self.tools.call(name, arguments)
                    out.messages.append({"role": "tool", "content": result})
                    out.tool_errors += int(not ok)
            else:
                out.action = self.agent.parse(text)
                obs, reward, finished, info = env.step(out.action)
                out.reward, out.done, out.info = float(reward), bool(finished), dict(info)
                if not out.done:
                    out.messages = [self.agent.observation_message(obs)]
        except Exception as e:  # a user's environment, agent or tool: only this trajectory ends
            log.warning("agent: environment step failed: %r", e)
            out.failed = True
        out.seconds = time.perf_counter() - t
        return out

    def answered(self, s: Live, step: Step, a: _Answer) -> str | None:
        """Record the answer to a turn; returns why the trajectory ends, or None when it goes on (its context
        then holds the response and the observation)."""
        self.env_seconds += a.seconds
        step.reward, step.action, step.info = a.reward, a.action, a.info
        step.tool_calls, step.tool_errors = a.tool_calls, a.tool_errors
        s.used += len(step.response_ids)
        s.turn += 1
        end = "error" if a.failed else "env_done" if a.done else None
        if end is None and s.turn >= self.limits.max_turns:
            end = "max_turns"
        if end is None and s.used >= self.limits.max_response_length:
            end = "length"
        if end is None:
            ended = bool(step.response_ids) and step.response_ids[-1] == self.eos_id
            try:
                step.observation_ids = observation_delta(self.tokenizer, a.messages, ended, self.tool_schemas)
            except Exception as e:  # e.g. an observation the chat template cannot render
                log.warning("agent: observation could not be rendered: %r", e)
                end = "error"
        if end is None:
            s.context = s.context + step.response_ids + step.observation_ids
            if len(s.context) + 1 > self.limits.max_model_len:
                end = "max_prompt_length"
        return end

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.env_seconds += time.perf_counter() - t
