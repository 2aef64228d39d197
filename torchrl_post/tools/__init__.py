"""Tools an agent may call: plain functions of keyword arguments returning text. Built-ins by name
(`calculator`, `python`), others by import path (`package.module:function`), as reward functions."""

from __future__ import annotations

from collections.abc import Callable

from torchrl_post.reward.scoring import load_function
from torchrl_post.tools.builtin import calculator, python

Tool = Callable[..., str]
BUILTIN_TOOLS: dict[str, Tool] = {"calculator": calculator, "python": python}


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
