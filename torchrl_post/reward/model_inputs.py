"""What a reward model reads: a prompt's chat messages and one response, in the reward model's own tokens.

The policy's and the reward model's tokenizers differ in real use (a Qwen policy scored by a Llama reward model),
so the reward model never sees the policy's token ids: the response is decoded to text and the conversation is
re-tokenised here, through the reward model's chat template (the messages, then the response as the assistant's
turn), or, for a tokenizer without one, as the user turns' text and the response joined by newlines. A sequence
classifier scores the last token, so a conversation longer than `max_length` keeps its last `max_length` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RewardInput:
    ids: list[int]
    truncated: bool
    """More than max_length tokens: the first ones were dropped."""


def conversation(messages: list[dict[str, Any]], response: str) -> list[dict[str, Any]]:
    """The prompt's messages with the response as the assistant's turn."""
    return [*messages, {"role": "assistant", "content": response}]


def reward_model_ids(tokenizer: Any, messages: list[dict[str, Any]], response: str, max_length: int) -> RewardInput:
    """The reward model's token ids of `messages` + `response` (see the module), at most `max_length`."""
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(conversation(messages, response), tokenize=True)
        ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    else:
        text = "\n".join([*(str(m["content"]) for m in messages if m.get("role") != "system"), response])
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if len(ids) <= max_length:
        return RewardInput(ids, False)
    return RewardInput(ids[-max_length:], True)
