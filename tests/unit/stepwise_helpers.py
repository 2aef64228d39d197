"""Hand-built agent trajectories and their step-wise advantage, shared by the algos and agent tests."""

from __future__ import annotations

import math

from torchrl_post.agent.base import Step, Trajectory

R = 1 / math.sqrt(2)  # (r - mean) / unbiased std of two different values


def _trajectories() -> list[Trajectory]:
    a = Trajectory(0, {}, prompt=[1, 2], termination="env_done", reward=1.0)
    a.steps = [Step([1, 2], [3, 4, 5], [-0.1] * 3, observation_ids=[6, 7]), Step([1, 2, 3, 4, 5, 6, 7], [8], [-0.2])]
    a.steps[1].reward = 1.0
    b = Trajectory(0, {}, prompt=[1, 2], termination="max_turns", reward=0.0)
    b.steps = [Step([1, 2], [9], [-0.3], observation_ids=[6]), Step([1, 2, 9, 6], [10, 11], [-0.4, -0.5])]
    return [a, b]
