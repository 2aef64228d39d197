"""Tests of torchrl_post/tools/__init__.py: the tool registry, the tool box's errors as observations, schemas."""

from __future__ import annotations

import json

import pytest

from torchrl_post.config.errors import ConfigError
from torchrl_post.tools import MAX_TOOL_OUTPUT, ToolBox, resolve_tool
from torchrl_post.tools.builtin import calculator

# --- the registry -------------------------------------------------------------------------------------------


def test_tool_registry() -> None:
    assert resolve_tool("calculator") is calculator
    assert resolve_tool("torchrl_post.tools.builtin:calculator") is calculator
    with pytest.raises(ConfigError, match="agent.tools: tool 'shell'"):
        resolve_tool("shell")


# --- the tool box -------------------------------------------------------------------------------------------


def shout(text: str, times: int = 1) -> str:
    """Upper-case `text`, repeated.

    More detail the schema leaves out."""
    return text.upper() * times


def boom(x: str) -> str:
    raise RuntimeError("tool broke")


def test_toolbox_errors_are_observations() -> None:
    box = ToolBox.from_specs(["calculator", "tests.unit.tools.test_init:shout", "tests.unit.tools.test_init:boom"])
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
    (calc, sh) = ToolBox.from_specs(["calculator", "tests.unit.tools.test_init:shout"]).schemas()
    assert calc["function"]["name"] == "calculator" and calc["function"]["parameters"]["required"] == ["expression"]
    f = sh["function"]
    assert f["description"] == "Upper-case `text`, repeated."
    assert f["parameters"]["properties"] == {"text": {"type": "string"}, "times": {"type": "integer"}}
    assert f["parameters"]["required"] == ["text"]
