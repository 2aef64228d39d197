"""Named chat templates for data.chat_template (ROLL's data_args.template, TRL's chat_template_path).

    use_chat_template("qwen2_5", tokenizer)      # or a path to a .jinja file; None keeps the tokenizer's own

The chosen template is set on the tokenizer (and a vision-language model's processor) once, when the run is set
up, so every rendering uses it: the data's prompts, an agent's first prompt and observation turns, the exported
tokenizer. The jinja here is ours, written to render the formats the names stand for:

- chatml: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, `<|im_start|>assistant\\n` to generate (ROLL's
  chatml); with `tools`, the schemas and the `<tool_call>` convention in the system turn and tool results as
  `<tool_response>` in a user turn, as Qwen2.5 renders them.
- qwen2_5: chatml with Qwen2.5's default system prompt where the messages bring none (Qwen2.5's own template).
- empty: ROLL's name for chatml without a system prompt: chatml's rendering.
- llama3: Llama 3 Instruct's headers (`<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>`),
  the BOS token first; renders no tools (an error if given).
- base: ROLL's base-model format, one user message inside a fixed instruction (`... User: {q} Assistant:`).

Simplified on purpose: ROLL's `native` and `qwen3` (the tokenizer's own template) are null here; its longCoT
variants (a prompt prefix or a `<think>` suffix) are not named: write a .jinja file for them. A vision-language
model takes a path only: these render text, not a processor's image items.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from torchrl_post.config.enums import ChatTemplateName
from torchrl_post.config.errors import ConfigError

QWEN2_5_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

_CHATML = r"""
{%- set ns = namespace(system=__SYSTEM__, first=0) -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set ns.system = messages[0].content -%}
    {%- set ns.first = 1 -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' + (ns.system + '\n\n' if ns.system else '') -}}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with '
        + 'function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
        + '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        + '<args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif ns.system -%}
    {{- '<|im_start|>system\n' + ns.system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
    {%- if message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') -}}
        {%- for call in (message.tool_calls or []) -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {{- ('\n' if message.content or not loop.first else '') + '<tool_call>\n{"name": "' + fn.name
                + '", "arguments": ' + (fn.arguments | tojson) + '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

_LLAMA3 = r"""
{%- if tools -%}
    {{- raise_exception('data.chat_template=llama3 renders no tool schemas; use qwen2_5, chatml or a .jinja file') -}}
{%- endif -%}
{%- if bos_token -%}
    {{- bos_token -}}
{%- endif -%}
{%- for message in messages -%}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + (message.content or '') | trim
        + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""

_BASE = r"""
{%- if messages | length != 1 or messages[0].role != 'user' or tools -%}
    {{- raise_exception('data.chat_template=base renders one user message (no system, tools or agent turns)') -}}
{%- endif -%}
{{- 'A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The '
    + 'assistant first thinks about the reasoning process in the mind and then provides the user with the answer, '
    + 'ensuring that the final result in the answer is enclosed in \\boxed{}. The reasoning process and answer '
    + 'are enclosed within \'<think>\' \'</think>\' and \'<answer>\' \'</answer>\' tags, respectively, i.e., '
    + '<think> reasoning process here </think> <answer> answer here </answer>. User: ' + messages[0].content
    + ' Assistant:' -}}
"""


def _chatml(system: str | None) -> str:
    return _CHATML.replace("__SYSTEM__", "none" if system is None else json.dumps(system)).strip()


TEMPLATES: dict[str, str] = {
    "chatml": _chatml(None),
    "qwen2_5": _chatml(QWEN2_5_SYSTEM),
    "llama3": _LLAMA3.strip(),
    "base": _BASE.strip(),
    "empty": _chatml(None),
}
"""data.chat_template's names (`enums.ChatTemplateName`) -> their jinja."""
assert set(TEMPLATES) == set(get_args(ChatTemplateName))


def chat_template_text(value: str) -> str:
    """The jinja data.chat_template names: a known name's, or the text of the .jinja file at that path."""
    if value in TEMPLATES:
        return TEMPLATES[value]
    path = Path(value)
    if not path.is_file():
        raise ConfigError(
            f"data.chat_template={value!r}: no such file; give a .jinja file or one of {', '.join(TEMPLATES)} "
            "(null: the tokenizer's own)"
        )
    return path.read_text(encoding="utf-8")


def use_chat_template(value: str | None, tokenizer: Any, processor: Any = None) -> None:
    """Put data.chat_template on the tokenizer and a vision-language model's `processor`; None leaves theirs."""
    if value is None:
        return
    if processor is not None and value in TEMPLATES:
        raise ConfigError(
            f"data.chat_template={value!r} renders text only, and this vision-language model's prompts hold images; "
            "give a .jinja file that places its image tokens, or null for the processor's own template"
        )
    text = chat_template_text(value)
    tokenizer.chat_template = text
    if processor is not None:
        processor.chat_template = text
