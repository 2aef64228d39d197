"""Tools an agent may call: plain functions of keyword arguments returning text. Built-ins by name
(`calculator`, `python`), others by import path (`package.module:function`), as reward functions, or the
functions themselves (the Python API: `train(tools=[calculator, search])`).

    box = ToolBox.from_specs(["calculator", "mypkg.tools:search"])
    box.schemas()                                  # OpenAI-style function schemas for the chat template
    text, ok = box.call("calculator", '{"expression": "12+30"}')
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from torchrl_post.reward.scoring import load_function
from torchrl_post.tools.builtin import calculator, python

Tool = Callable[..., str]
BUILTIN_TOOLS: dict[str, Tool] = {"calculator": calculator, "python": python}
MAX_TOOL_OUTPUT = 2000
"""Characters of one tool result the model sees (longer output is cut and marked)."""


def resolve_tool(spec: str, key: str = "agent.tools") -> Tool:
    """A built-in name or `package.module:function`; one ConfigError naming `key` otherwise."""
    if spec in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[spec]
    from torchrl_post.config.errors import ConfigError

    if ":" not in spec:
        raise ConfigError(
            f"{key}: tool {spec!r} is neither a built-in ({', '.join(BUILTIN_TOOLS)}) nor package.module:function"
        )
    return load_function(spec, key)


def tool_schema(name: str, fn: Tool) -> dict[str, Any]:
    """The function schema chat templates render (`tools=`): name, the docstring's first paragraph, and the
    keyword parameters (strings unless annotated int/float/bool)."""
    kinds = {int: "integer", float: "number", bool: "boolean", "int": "integer", "float": "number", "bool": "boolean"}
    props: dict[str, Any] = {}
    required = []
    for p in inspect.signature(fn).parameters.values():
        props[p.name] = {"type": kinds.get(p.annotation, "string")}
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    doc = (inspect.getdoc(fn) or name).split("\n\n")[0].replace("\n", " ")
    params = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "function": {"name": name, "description": doc, "parameters": params}}


class ToolBox:
    """The tools of one run, by the name the model calls them with."""

    def __init__(self, tools: dict[str, Tool]) -> None:
        self.tools = tools

    @classmethod
    def from_specs(cls, specs: Sequence[str | Tool], key: str = "agent.tools") -> ToolBox:
        """Tools by built-in name, by `package.module:function`, or as functions (named by their __name__)."""
        tools: dict[str, Tool] = {}
        for i, spec in enumerate(specs):
            if callable(spec):
                name, fn = getattr(spec, "__name__", type(spec).__name__), spec
            else:
                fn = resolve_tool(str(spec), f"{key}[{i}]")
                name = str(spec) if spec in BUILTIN_TOOLS else fn.__name__
            if name in tools:
                from torchrl_post.config.errors import ConfigError

                raise ConfigError(f"{key}[{i}]: a second tool named {name!r}; the model calls tools by name")
            tools[name] = fn
        return cls(tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(name, fn) for name, fn in self.tools.items()]

    def call(self, name: str, arguments: str) -> tuple[str, bool]:
        """(result text, ok). An unknown tool, arguments that are not a JSON object, a tool that raises or
        answers "error: ..." give an error text for the model (ok False), never an exception."""
        fn = self.tools.get(name)
        if fn is None:
            return f"error: unknown tool {name!r}; available: {', '.join(self.tools)}", False
        try:
            args = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError as e:
            return f"error: arguments are not JSON: {e}", False
        if not isinstance(args, dict):
            return "error: arguments must be a JSON object", False
        try:
            out = str(fn(**args))
        except Exception as e:  # a tool's failure is the model's observation, not the run's end
            return f"error: {type(e).__name__}: {e}", False
        if len(out) > MAX_TOOL_OUTPUT:
            out = out[:MAX_TOOL_OUTPUT] + "\n[output truncated]"
        return out, not out.startswith("error:")
