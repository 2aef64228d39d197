"""Token-in, token-out conversation growth: observation turns as token deltas, never a re-rendered history.

The chat template is rendered once for the first prompt. After each response, the loop appends the ids of
`observation_delta`: the template text that follows the assistant's end token (Qwen's newline after
`<|im_end|>`, which the model never emits; and the end token itself when a turn was cut at its token budget),
then the observation turn and the next generation prompt. The engine's own ids are kept as they were.
"""

from __future__ import annotations

from typing import Any

_PROBE_USER = {"role": "user", "content": "u"}
_PROBE_ASSISTANT = {"role": "assistant", "content": "a"}


Tools = list[dict[str, Any]] | None
"""Function schemas the template renders (`tools=`, e.g. into Qwen2.5's system message); None: no tools."""


def render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool, tools: Tools = None) -> str:
    kwargs = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)
    return str(text)


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]], tools: Tools = None) -> list[int]:
    """The first prompt of a trajectory: the rendered messages (and tool schemas) and the generation prompt."""
    return list(tokenizer(render(tokenizer, messages, True, tools), add_special_tokens=False)["input_ids"])


def observation_delta(
    tokenizer: Any, messages: list[dict[str, str]] | dict[str, str], response_ended: bool, tools: Tools = None
) -> list[int]:
    """Ids to append after an assistant response to carry `messages` (an observation, or one message per
    tool result) and open the next assistant turn.

    `response_ended`: the response ends with the end-of-turn token (False when it was cut at max tokens,
    then that token is part of the delta). Computed from the template on a probe conversation, so any
    template that renders a conversation as a prefix of its continuation works.
    """
    if isinstance(messages, dict):
        messages = [messages]
    base = render(tokenizer, [_PROBE_USER, _PROBE_ASSISTANT], False, tools)
    full = render(tokenizer, [_PROBE_USER, _PROBE_ASSISTANT, *messages], True, tools)
    if not full.startswith(base):
        raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
    after_content = base[base.rindex(_PROBE_ASSISTANT["content"]) + len(_PROBE_ASSISTANT["content"]) :]
    end = tokenizer.eos_token or ""
    bridge = after_content[len(end) :] if response_ended and after_content.startswith(end) else after_content
    return list(tokenizer(bridge + full[len(base) :], add_special_tokens=False)["input_ids"])


class ChatAgent:
    """The plain chat agent: each observation a user turn, the response (stripped) the action. Tool calls are
    the loop's (`agent.tools`); subclass to parse actions or shape prompts differently."""

    def initial_messages(self, task: dict[str, Any], observation: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": observation}]

    def parse(self, response_text: str) -> str:
        return response_text.strip()

    def observation_message(self, observation: str) -> dict[str, str]:
        return {"role": "user", "content": observation}
