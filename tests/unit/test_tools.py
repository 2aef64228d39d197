"""Tool calls: vLLM's hermes parser on model text, the tool box's errors as observations, schemas."""

from __future__ import annotations

import json

import pytest

from torchrl_post.agent.loop import AgentLoop, LoopLimits
from torchrl_post.agent.math_agent import MathEnv, ToolAgent
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.rollout.vllm_engine import tool_call_parser, tool_parser_names
from torchrl_post.tools import MAX_TOOL_OUTPUT, ToolBox


def shout(text: str, times: int = 1) -> str:
    """Upper-case `text`, repeated.

    More detail the schema leaves out."""
    return text.upper() * times


def boom(x: str) -> str:
    raise RuntimeError("tool broke")


@pytest.fixture(scope="module")
def parse():  # type: ignore[no-untyped-def]
    return tool_call_parser("hermes", build_char_tokenizer())


def test_hermes_calls_parsed(parse) -> None:  # type: ignore[no-untyped-def]
    one = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    assert parse(one) == (True, [("calculator", json.dumps({"expression": "2+3"}))])
    two = one + '<tool_call>{"name": "shout", "arguments": {"text": "hi", "times": 2}}</tool_call>'
    tried, calls = parse("thinking... " + two)
    assert tried and [c[0] for c in calls] == ["calculator", "shout"] and json.loads(calls[1][1])["times"] == 2
    assert parse("The answer is 5.") == (False, [])
    assert parse('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>') == (True, [])
    assert "hermes" in tool_parser_names()


def test_toolbox_errors_are_observations() -> None:
    box = ToolBox.from_specs(["calculator", "tests.unit.test_tools:shout", "tests.unit.test_tools:boom"])
    assert box.call("calculator", '{"expression": "123456+654321"}') == ("777777", True)
    assert box.call("shout", '{"text": "ab", "times": 2}') == ("ABAB", True)
    text, ok = box.call("search", "{}")
    assert not ok and "unknown tool 'search'" in text and "calculator" in text
    assert box.call("calculator", "not json")[1] is False
    assert box.call("calculator", "[1, 2]") == ("error: arguments must be a JSON object", False)
    assert box.call("boom", '{"x": "1"}') == ("error: RuntimeError: tool broke", False)
    assert box.call("calculator", '{"expression": "1/0"}')[1] is False  # the tool's own "error: ..."
    long, ok = box.call("shout", json.dumps({"text": "x", "times": MAX_TOOL_OUTPUT + 10}))
    assert ok and long.endswith("[output truncated]") and len(long) < MAX_TOOL_OUTPUT + 30


def test_schemas_from_signatures() -> None:
    (calc, sh) = ToolBox.from_specs(["calculator", "tests.unit.test_tools:shout"]).schemas()
    assert calc["function"]["name"] == "calculator" and calc["function"]["parameters"]["required"] == ["expression"]
    f = sh["function"]
    assert f["description"] == "Upper-case `text`, repeated."
    assert f["parameters"]["properties"] == {"text": {"type": "string"}, "times": {"type": "integer"}}
    assert f["parameters"]["required"] == ["text"]


def test_loop_answers_tool_calls_and_counts_errors(parse) -> None:  # type: ignore[no-untyped-def]
    """The loop's answer to one response (no engine needed): tool results as tool messages, errors counted,
    a response without a call goes to the environment."""
    tok = build_char_tokenizer()
    loop = AgentLoop(
        None, tok, MathEnv, ToolAgent(), LoopLimits(), tools=ToolBox.from_specs(["calculator"]), parse_calls=parse
    )
    env = MathEnv()
    env.reset({"question": "What is 500+600?", "answer": "1100"})
    good = loop._answer(
        env, '<tool_call>{"name": "calculator", "arguments": {"expression": "500+600"}}</tool_call>', ""
    )
    assert good.messages == [{"role": "tool", "content": "1100"}] and good.tool_calls == 1 and good.tool_errors == 0
    assert not good.done and good.reward == 0.0
    bad = loop._answer(env, "<tool_call>{oops</tool_call>", "")
    assert bad.tool_calls == 1 and bad.tool_errors == 1 and bad.messages[0]["content"].startswith("error: malformed")
    final = loop._answer(env, "1100<|im_end|>", "1100")
    assert final.done and final.reward == 1.0 and final.tool_calls == 0
