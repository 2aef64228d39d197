"""Agents and environments: the protocols (rLLM's shape), and the trajectory they produce.

An environment is reset with a task (a data row's fields) and stepped with the agent's action:
    reset(task) -> observation;  step(action) -> (observation, reward, done, info)
An agent turns the conversation into chat messages and parses a response into an action:
    initial_messages(task, observation) -> messages;  parse(response_text) -> action
    observation_message(observation) -> the message that carries the next observation
Both are loaded by import path (`agent.env=pkg.module:Class`, `agent.agent=pkg.module:Class`), like reward
functions, or passed as classes to the Python API (`api.train(env_cls=..., agent_cls=...)`). A trajectory
keeps token ids exactly as the engine produced them (token in, token out): each step's response ids and
logprobs, then the observation ids appended as a delta (with any template tokens the model does not emit),
never re-rendered and re-tokenised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from torchrl_post.engines.batch import pad_samples
from torchrl_post.types import Batch

AGENT_TERMINATIONS = ("env_done", "max_turns", "length", "max_prompt_length", "timeout", "error")
"""Why a trajectory ended (rLLM's set; `length` is rLLM's max_response_length, the name verl's finish reason and
`types.TERMINATIONS` use). Every one is also a `types.TERMINATIONS` name."""
METRIC_NAMES = {"length": "max_response_length"}
"""rLLM's names in `agent/termination/<reason>` where the code name differs."""


class Env(Protocol):
    def reset(self, task: dict[str, Any]) -> str: ...

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]: ...


class Agent(Protocol):
    def initial_messages(self, task: dict[str, Any], observation: str) -> list[dict[str, str]]: ...

    def parse(self, response_text: str) -> str: ...

    def observation_message(self, observation: str) -> dict[str, str]: ...


@dataclass
class Step:
    """One turn: what the engine was given and produced, and what the environment answered."""

    prompt_ids: list[int]
    """The whole context the engine saw for this turn."""
    response_ids: list[int]
    logprobs: list[float]
    observation_ids: list[int] = field(default_factory=list)
    """Tokens appended after the response before the next turn (template bridge + observation); loss mask 0."""
    reward: float = 0.0
    action: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    tool_calls: int = 0
    """Tool calls this response made (a malformed call counts one, and one error)."""
    tool_errors: int = 0
    versions: list[int] = field(default_factory=list)
    """The policy version that generated each response token (several when the turn spans a weight update)."""
    finish_reason: str | None = None
    """The engine's: stop or length (None: the turn ran out of time)."""
    routes: torch.Tensor | None = None
    """A mixture-of-experts engine's experts of the turn's whole sequence (context and response, [tokens - 1, L, k]:
    its request reads no cached prefix, so its prefill computed every position); None where not recorded."""


@dataclass
class Trajectory:
    uid: int
    """The prompt group it belongs to (its task's position in the step's batch)."""
    task: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    """The first prompt's ids (the rendered initial messages)."""
    termination: str = "env_done"
    reward: float = 0.0
    """The trajectory's reward (the sum of step rewards unless a reward function rescored it)."""

    @property
    def versions(self) -> list[int]:
        """The policy version of every response token, turn after turn."""
        return [v for s in self.steps for v in s.versions]

    def token_versions(self) -> list[int]:
        """The policy version of each token `response_tokens` gives (-1 for observation tokens)."""
        out: list[int] = []
        for i, s in enumerate(self.steps):
            out += s.versions if len(s.versions) == len(s.response_ids) else [-1] * len(s.response_ids)
            if i + 1 < len(self.steps):
                out += [-1] * len(s.observation_ids)
        return out

    def response_tokens(self) -> tuple[list[int], list[float], list[float]]:
        """Everything after the first prompt as (ids, logprobs, loss mask): responses trained (mask 1),
        observations attended but not trained (mask 0); the last observation is dropped (nothing follows it)."""
        ids: list[int] = []
        lps: list[float] = []
        mask: list[float] = []
        for i, s in enumerate(self.steps):
            ids += s.response_ids
            lps += s.logprobs
            mask += [1.0] * len(s.response_ids)
            if i + 1 < len(self.steps):
                ids += s.observation_ids
                lps += [0.0] * len(s.observation_ids)
                mask += [0.0] * len(s.observation_ids)
        return ids, lps, mask


def trajectories_to_batch(trajectories: list[Trajectory], pad_id: int) -> Batch:
    """Whole trajectories as samples: the first prompt, then every response (loss mask 1) with the
    observations between them (loss mask 0); score = the trajectory's reward."""
    rows = [t.response_tokens() for t in trajectories]
    batch = pad_samples(
        [t.prompt or [pad_id] for t in trajectories],
        [ids for ids, _, _ in rows],
        [lps for _, lps, _ in rows],
        [mask for _, _, mask in rows],
        [t.uid for t in trajectories],
        [t.termination for t in trajectories],
        pad_id,
        routes=_routes(
            [t.steps[-1] if t.steps else None for t in trajectories],
            [len(t.prompt or [pad_id]) + len(r[0]) for t, r in zip(trajectories, rows, strict=True)],
        ),
        versions=[t.token_versions() for t in trajectories],
    )
    _trajectory_fields(batch, trajectories)
    return batch


def steps_to_batch(trajectories: list[Trajectory], pad_id: int) -> Batch:
    """Each step its own sample (`algorithm.stepwise_advantage`): the step's whole context as the prompt, its
    response trained. Rows carry the trajectory's termination, reward (`scores`) and counts, and their own
    `traj_ids`, `step_ids` and `step_rewards`. A trajectory without steps gives one empty row."""
    prompts, responses, lps, masks, owners, steps, rewards, versions = [], [], [], [], [], [], [], []
    for j, t in enumerate(trajectories):
        for k, s in enumerate(t.steps or [Step(t.prompt or [pad_id], [], [])]):
            prompts.append(s.prompt_ids)
            responses.append(s.response_ids)
            lps.append(s.logprobs)
            masks.append([1.0] * len(s.response_ids))
            versions.append(s.versions if len(s.versions) == len(s.response_ids) else [-1] * len(s.response_ids))
            owners.append(j)
            steps.append(k)
            rewards.append(s.reward)
    batch = pad_samples(
        prompts,
        responses,
        lps,
        masks,
        [trajectories[j].uid for j in owners],
        [trajectories[j].termination for j in owners],
        pad_id,
        routes=_routes(
            [t.steps[k] if t.steps else None for t, k in zip((trajectories[j] for j in owners), steps, strict=True)],
            [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)],
        ),
        versions=versions,
    )
    _trajectory_fields(batch, [trajectories[j] for j in owners])
    batch.traj_ids = torch.tensor(owners, dtype=torch.long)
    batch.step_ids = torch.tensor(steps, dtype=torch.long)
    batch.step_rewards = torch.tensor(rewards, dtype=torch.float32)
    return batch


def _routes(steps: list[Step | None], lengths: list[int]) -> list[torch.Tensor] | None:
    """Each row's recorded experts ([tokens - 1, L, k]): a whole trajectory's are its last turn's (whose prefill
    computed every position of the row), a step's its own; -1 (the trainer's router chooses) for a row whose turn
    recorded none (a turn cut by the timeout). None when no row has any."""
    known = [s.routes for s in steps if s is not None and s.routes is not None]
    if not known:
        return None
    layers, k = known[0].shape[1:]
    out = []
    for step, length in zip(steps, lengths, strict=True):
        routes = step.routes if step is not None and step.routes is not None else None
        rows = torch.full((max(length - 1, 0), layers, k), -1, dtype=torch.int16)
        if routes is not None:
            n = min(len(routes), len(rows))
            rows[:n] = routes[:n]
        out.append(rows)
    return out


def _trajectory_fields(batch: Batch, per_row: list[Trajectory]) -> None:
    batch.scores = torch.tensor([t.reward for t in per_row], dtype=torch.float32)
    batch.reward_errors = torch.tensor([float(t.termination == "error") for t in per_row])
    batch.turns = torch.tensor([float(len(t.steps)) for t in per_row])
    batch.tool_calls = torch.tensor([float(sum(s.tool_calls for s in t.steps)) for t in per_row])
    batch.tool_errors = torch.tensor([float(sum(s.tool_errors for s in t.steps)) for t in per_row])
