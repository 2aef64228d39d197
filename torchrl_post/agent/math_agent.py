"""A math agent with tools (rLLM's train_math_agent): the question comes in, the model may call tools (the
loop runs them, `agent.tools`), and its first answer without a tool call ends the episode, scored on the
final answer.

    agent.env=torchrl_post.agent.math_agent:MathEnv agent.agent=torchrl_post.agent.math_agent:ToolAgent
    agent.tools=[calculator]

The task's `question` is the row's prompt and `answer` the expected integer; reward 1 when the final answer is
exactly that integer (the `arithmetic` reward), else 0. `configs/math_agent.yaml` trains it on the demo's
large-number sums, which the tiny model cannot add in its head but can hand to the calculator.
"""

from __future__ import annotations

from typing import Any

from torchrl_post.agent.chat import ChatAgent
from torchrl_post.reward.builtin import arithmetic


class MathEnv:
    def reset(self, task: dict[str, Any]) -> str:
        self.answer = str(task["answer"])
        return str(task["question"])

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        reward = arithmetic("math_agent", action, self.answer)
        return "", reward, True, {"correct": bool(reward)}


class ToolAgent(ChatAgent):
    """The question as the user turn; a response is the action as it stands (tool calls are the loop's)."""
