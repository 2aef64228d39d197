"""Tests of torchrl_post/agent/loop.py: the loop's answer to one response (tool calls, errors, the env)."""

from __future__ import annotations

from torchrl_post.agent.loop import AgentLoop, LoopLimits
from torchrl_post.agent.math_agent import MathEnv, ToolAgent
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.tools import ToolBox


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
