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


def render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt))


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The first prompt of a trajectory: the rendered messages and the generation prompt."""
    return list(tokenizer(render(tokenizer, messages, True), add_special_tokens=False)["input_ids"])


def observation_delta(tokenizer: Any, message: dict[str, str], response_ended: bool) -> list[int]:
    """Ids to append after an assistant response to carry `message` and open the next assistant turn.

    `response_ended`: the response ends with the end-of-turn token (False when it was cut at max tokens,
    then that token is part of the delta). Computed from the template on a probe conversation, so any
    template that renders a conversation as a prefix of its continuation works.
    """
    base = render(tokenizer, [_PROBE_USER, _PROBE_ASSISTANT], False)
    full = render(tokenizer, [_PROBE_USER, _PROBE_ASSISTANT, message], True)
    if not full.startswith(base):
        raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
    after_content = base[base.rindex(_PROBE_ASSISTANT["content"]) + len(_PROBE_ASSISTANT["content"]) :]
    end = tokenizer.eos_token or ""
    bridge = after_content[len(end) :] if response_ended and after_content.startswith(end) else after_content
    return list(tokenizer(bridge + full[len(base) :], add_special_tokens=False)["input_ids"])
