"""A multi-turn environment with feedback: answer the task's question, told "higher" or "lower" after each wrong
answer, until it is right.

    agent.env=torchrl_post.agent.guess_number:GuessNumberEnv agent.agent=torchrl_post.agent.guess_number:GuessAgent

The task's `answer` is the number (the demo data's sums); the first observation is the row's question (or, with
none, "Guess my number (0-18)."). Reward 1 for the turn that names it (the response is exactly that integer),
0 otherwise (an answer that is not just an integer is told so); the episode ends when it is named
(`env_done`) or at agent.max_turns. A policy gains by answering right at once, in the plain format, and by
using the hints when it did not.
"""

from __future__ import annotations

import re
from typing import Any

from torchrl_post.agent.chat import ChatAgent


class GuessNumberEnv:
    def reset(self, task: dict[str, Any]) -> str:
        self.answer = int(str(task["answer"]).strip())
        return str(task.get("question") or "Guess my number (0-18).")

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if re.fullmatch(r"-?\d+", action.strip()) is None:
            return "Answer with just the number.", 0.0, False, {"valid": False}
        guess = int(action.strip())
        if guess == self.answer:
            return "Correct.", 1.0, True, {"valid": True}
        return ("Higher." if guess < self.answer else "Lower."), 0.0, False, {"valid": True}


class GuessAgent(ChatAgent):
    """The question and each hint as user turns; the response is the guess."""
