"""The agent loop on the in-process engine: many trajectories at once, each turn added as soon as the previous
one finished and its environment answered, while other trajectories are still decoding.

    loop = AgentLoop(engine, tokenizer, make_env, agent, limits)
    trajectories = loop.run([(uid, task), ...], params)      # n trajectories per task when params.n > 1

Drives the engine step by step (`add_request` / `step` / `abort`: rollout/vllm_engine.py). Token in, token out
(agent/chat.py). Limits end only their own trajectory: `max_turns`, the response token budget (`length`), the
context (`max_prompt_length`), the wall clock (`timeout`: the request is aborted, completed turns are kept),
and an environment or agent that raises (`error`). Seeds are per (uid, sample, turn), so a run is reproducible.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from torchrl_post.agent.base import Agent, Env, Step, Trajectory
from torchrl_post.agent.chat import observation_delta, prompt_ids
from torchrl_post.rollout.base import SamplingParams

log = logging.getLogger(__name__)


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
class _Live:
    traj: Trajectory
    env: Env
    context: list[int]
    seed_uid: int
    started: float
    turn: int = 0
    used: int = 0  # response tokens so far


class AgentLoop:
    def __init__(
        self, engine: Any, tokenizer: Any, make_env: Callable[[], Env], agent: Agent, limits: LoopLimits
    ) -> None:
        self.engine, self.tokenizer, self.make_env, self.agent, self.limits = engine, tokenizer, make_env, agent, limits
        self.eos_id = tokenizer.eos_token_id
        self.env_seconds = 0.0
        self.engine_steps = 0

    def run(self, tasks: list[tuple[int, dict[str, Any]]], params: SamplingParams) -> list[Trajectory]:
        """`params.n` trajectories per task, in task-major order."""
        live: dict[str, _Live] = {}
        done: dict[str, Trajectory] = {}
        order = []
        for uid, task in tasks:
            for k in range(params.n):
                rid = f"{uid}-{k}"
                order.append(rid)
                state = self._start(uid, task, k * 1_000_003 + uid)
                if isinstance(state, Trajectory):
                    done[rid] = state
                else:
                    live[rid] = state
                    self._submit(rid, state, params)
        while live:
            for rid, ids, lps, reason in self.engine.step():
                if reason is not None and rid in live:
                    self._finish_turn(rid, live, done, ids, lps, reason, params)
            self.engine_steps += 1
            self._check_timeouts(live, done)
        return [done[rid] for rid in order]

    def _start(self, uid: int, task: dict[str, Any], seed_uid: int) -> _Live | Trajectory:
        traj = Trajectory(uid, task)
        try:
            env = self.make_env()
            obs = self._env_call(env.reset, task)
            context = prompt_ids(self.tokenizer, self.agent.initial_messages(task, obs))
            traj.prompt = list(context)
        except Exception as e:  # a user's environment may raise anything: only this trajectory ends
            log.warning("agent: environment reset failed: %r", e)
            traj.termination = "error"
            return traj
        if len(context) + 1 > self.limits.max_model_len:
            traj.termination = "max_prompt_length"
            return traj
        return _Live(traj, env, context, seed_uid, time.perf_counter())

    def _submit(self, rid: str, s: _Live, params: SamplingParams) -> None:
        budget = min(self.limits.max_response_length - s.used, self.limits.max_model_len - len(s.context))
        if self.limits.max_tokens_per_turn:
            budget = min(budget, self.limits.max_tokens_per_turn)
        turn_params = replace(params, n=1, max_tokens=max(1, min(params.max_tokens, budget)))
        self.engine.add_request(rid, list(s.context), turn_params, s.seed_uid + 7919 * s.turn)

    def _finish_turn(
        self,
        rid: str,
        live: dict[str, _Live],
        done: dict[str, Trajectory],
        ids: list[int],
        lps: list[float],
        reason: str,
        params: SamplingParams,
    ) -> None:
        s = live[rid]
        step = Step(list(s.context), list(ids), list(lps))
        s.traj.steps.append(step)
        s.used += len(ids)
        s.turn += 1
        end = None
        try:
            step.action = self.agent.parse(self.tokenizer.decode(ids, skip_special_tokens=True))
            obs, reward, finished, info = self._env_call(s.env.step, step.action)
            step.reward, step.info = float(reward), dict(info)
            if finished:
                end = "env_done"
        except Exception as e:
            log.warning("agent: environment step failed: %r", e)
            end = "error"
        if end is None and s.turn >= self.limits.max_turns:
            end = "max_turns"
        if end is None and s.used >= self.limits.max_response_length:
            end = "length"
        if end is None:
            message = self.agent.observation_message(obs)
            step.observation_ids = observation_delta(self.tokenizer, message, bool(ids) and ids[-1] == self.eos_id)
            s.context = s.context + step.response_ids + step.observation_ids
            if len(s.context) + 1 > self.limits.max_model_len:
                end = "max_prompt_length"
        if end is not None:
            self._end(rid, live, done, end)
        else:
            self._submit(rid, s, params)

    def _env_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.env_seconds += time.perf_counter() - t

    def _check_timeouts(self, live: dict[str, _Live], done: dict[str, Trajectory]) -> None:
        now = time.perf_counter()
        late = [rid for rid, s in live.items() if now - s.started > self.limits.timeout_s]
        if late:
            self.engine.abort(late)
            for rid in late:
                self._end(rid, live, done, "timeout")

    @staticmethod
    def _end(rid: str, live: dict[str, _Live], done: dict[str, Trajectory], termination: str) -> None:
        s = live.pop(rid)
        s.traj.termination = termination
        s.traj.reward = sum(step.reward for step in s.traj.steps)
        done[rid] = s.traj
