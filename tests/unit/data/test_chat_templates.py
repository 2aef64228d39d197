"""Tests of torchrl_post/data/chat_templates.py: data.chat_template's names render the hand-written strings, a
.jinja path works, the prompts and agent turns use it; a wrong name is refused when the config loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchrl_post.agent.chat import observation_delta, prompt_ids
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import DataConfig
from torchrl_post.data.chat_templates import QWEN2_5_SYSTEM, TEMPLATES, use_chat_template
from torchrl_post.data.dataset import load_prompts
from torchrl_post.demo.tokenizer import build_char_tokenizer

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def _render(name: str, messages: list[dict[str, Any]], generation_prompt: bool = True, **kw: Any) -> str:
    tok = build_char_tokenizer()
    use_chat_template(name, tok)
    return str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kw))


def test_chatml_by_hand() -> None:
    assert _render("chatml", CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    )
    # no system message: none rendered (ROLL's chatml and `empty`); no generation prompt when not asked
    assert _render("chatml", CHAT[1:], False) == "<|im_start|>user\n1+1?<|im_end|>\n"
    assert _render("empty", CHAT[1:]) == "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"


def test_qwen2_5_by_hand() -> None:
    assert _render("qwen2_5", CHAT[1:]) == (
        f"<|im_start|>system\n{QWEN2_5_SYSTEM}<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _render("qwen2_5", CHAT) == _render("chatml", CHAT)  # a given system prompt replaces the default
    with_tools = _render("qwen2_5", CHAT[1:], tools=[TOOL])
    assert with_tools == (
        f"<|im_start|>system\n{QWEN2_5_SYSTEM}\n\n# Tools\n\nYou may call one or more functions to assist with the "
        "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(TOOL)
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    )
    call: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1}}}],
    }
    turns = [CHAT[1], call, {"role": "tool", "content": "2"}, {"role": "tool", "content": "3"}]
    assert _render("chatml", turns, False) == (
        "<|im_start|>user\n1+1?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response><|im_end|>\n"
    )


def test_llama3_and_base_by_hand() -> None:
    assert _render("llama3", CHAT) == (
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n1+1?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )  # the char tokenizer has no BOS token; a Llama 3 tokenizer's comes first
    base = _render("base", CHAT[1:])
    assert base.startswith("A conversation between User and Assistant.") and base.endswith(" User: 1+1? Assistant:")
    assert "enclosed in \\boxed{}." in base
    with pytest.raises(Exception, match="data.chat_template=base renders one user message"):
        _render("base", CHAT)
    with pytest.raises(Exception, match="data.chat_template=llama3 renders no tool schemas"):
        _render("llama3", CHAT, tools=[TOOL])


def test_a_jinja_path(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>", encoding="utf-8")
    assert _render(str(path), CHAT) == "[system] Be brief.\n[user] 1+1?\n>"
    with pytest.raises(ConfigError, match=r"data.chat_template='.*missing.jinja': no such file"):
        use_chat_template(str(tmp_path / "missing.jinja"), build_char_tokenizer())


def test_null_keeps_the_tokenizer_s_own() -> None:
    tok = build_char_tokenizer()
    own = tok.chat_template
    use_chat_template(None, tok)
    assert tok.chat_template == own


def test_prompts_and_agent_turns_use_it(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    use_chat_template("qwen2_5", tok)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n", encoding="utf-8")
    expected = (
        f"<|im_start|>system\n{QWEN2_5_SYSTEM}<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    )
    ds = load_prompts([str(path)], DataConfig(max_prompt_length=512), tok, "train")
    assert ds.prompt_ids == [tok(expected, add_special_tokens=False)["input_ids"]]
    assert prompt_ids(tok, [CHAT[1]]) == ds.prompt_ids[0]
    delta = observation_delta(tok, {"role": "user", "content": "3"}, response_ended=True)
    assert tok.decode(delta) == "\n<|im_start|>user\n3<|im_end|>\n<|im_start|>assistant\n"


def test_a_vision_language_model_takes_a_path_only(tmp_path: Path) -> None:
    class Processor:
        chat_template = "own"

    with pytest.raises(ConfigError, match="data.chat_template='chatml' renders text only"):
        use_chat_template("chatml", build_char_tokenizer(), Processor())
    path = tmp_path / "vl.jinja"
    path.write_text("{{ messages[0].content }}", encoding="utf-8")
    processor, tok = Processor(), build_char_tokenizer()
    use_chat_template(str(path), tok, processor)
    assert processor.chat_template == tok.chat_template == "{{ messages[0].content }}"


def test_a_wrong_name_is_refused_when_the_config_loads() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["data.chat_template=qwen25"])
    msg = str(info.value)
    assert msg == (
        "data.chat_template='qwen25' is neither one of chatml, qwen2_5, llama3, base, empty nor a path to a .jinja "
        "file (null: the tokenizer's own)"
    )
    assert sorted(TEMPLATES) == sorted(["chatml", "qwen2_5", "llama3", "base", "empty"])
    assert load_config(["data.chat_template=llama3"]).data.chat_template == "llama3"
