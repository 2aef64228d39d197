"""The user's code and data a run calls, as objects: the reward function, the agent's environment, agent and
tools, and rows held in memory (`Components`).

The command line names them by import path (reward.function, agent.env / agent.agent, agent.tools) and by file
(data.train_files / data.val_files); the Python API (`api.py`) is given the objects themselves (`Given`).
`resolve_components` makes the same `Components` from either, once, on every rank, before anything loads: an
import path that fails is one ConfigError naming its key. `label_config` first writes what the given objects
replace into the config's keys (`agent.env: __main__:MathEnv`), so every check and plan that reads those keys,
and the config.yaml the run keeps, see what runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchrl_post.agent.base import Agent, Env
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import Config
from torchrl_post.data.dataset import check_rows_shape
from torchrl_post.reward.scoring import RewardFn, load_function, verl_reward
from torchrl_post.tools import Tool, ToolBox


@dataclass(frozen=True)
class AgentParts:
    """What agent episodes are made of, as objects: the classes of `agent.env` / `agent.agent` and the tools of
    `agent.tools` (imported by `components.resolve_components`), or what the Python API was given."""

    make_env: Callable[[], Env]
    """A new environment for each trajectory (the class, with any constructor arguments bound)."""
    make_agent: Callable[[], Agent]
    """The agent (one per loop: it only formats messages and parses actions)."""
    tools: ToolBox | None = None


Tools = Sequence[str | Tool] | Mapping[str, Tool]
"""Tools as built-in names, `package.module:function` strings or functions (named by __name__), or by name."""


@dataclass(frozen=True)
class Given:
    """What the Python API was passed in place of import paths and data files; None leaves the key in charge."""

    reward_fn: RewardFn | None = None
    """Replaces reward.function."""
    train_data: Any = None
    """Rows (a list of dicts, a datasets.Dataset) replacing data.train_files."""
    val_data: Any = None
    """Rows replacing data.val_files."""
    agent_cls: Callable[..., Agent] | None = None
    """Replaces agent.agent; called with `agent_args`."""
    agent_args: Mapping[str, Any] | None = None
    env_cls: Callable[..., Env] | None = None
    """Replaces agent.env; called with `env_args` for every trajectory."""
    env_args: Mapping[str, Any] | None = None
    tools: Tools | None = None
    """Replaces agent.tools."""


@dataclass(frozen=True)
class Components:
    """What a run calls and reads besides the model, as objects."""

    reward_fn: RewardFn | None = None
    """Scores single-turn responses (verl's signature); None: each data_source's built-in reward (and agent
    episodes, which their environment scores)."""
    agent: AgentParts | None = None
    """The environment, agent and tools of agent episodes; None: single-turn generation."""
    train_data: Any = None
    """Training rows held in memory (`data.dataset.prompts_from_rows`); None: read data.train_files."""
    val_data: Any = None
    """Validation rows held in memory; None: read data.val_files (if any)."""


def label(obj: Any) -> str:
    """How a config key names an object that replaces its import path: `module:qualified_name`."""
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}:{name}"


def _rows_label(name: str, data: Any) -> str:
    size = f": {len(data)} rows" if hasattr(data, "__len__") and not isinstance(data, (str, bytes)) else ""
    return f"<{name}{size}>"


def _tool_box(tools: Tools, key: str = "tools") -> ToolBox:
    if isinstance(tools, Mapping):
        for name, fn in tools.items():
            if not callable(fn):
                raise ConfigError(f"{key}[{name!r}] is a {type(fn).__name__}, not a function")
        return ToolBox({str(name): fn for name, fn in tools.items()})
    if isinstance(tools, str):
        raise ConfigError(f"{key}={tools!r} must be a list of tools, not one string: write [{tools!r}]")
    if not isinstance(tools, Iterable):
        raise ConfigError(
            f"{key}={tools!r} ({type(tools).__name__}) is not a list of tools; pass a list of functions, built-in "
            "names or import paths, or a dict of them by name"
        )
    return ToolBox.from_specs(list(tools), key)


def _callable(key: str, obj: Any) -> None:
    if obj is not None and not callable(obj):
        raise ConfigError(f"{key}={obj!r} is a {type(obj).__name__}; pass the function or class itself")


def _mapping(key: str, obj: Any) -> None:
    if obj is not None and not isinstance(obj, Mapping):
        raise ConfigError(f"{key}={obj!r} must be a dict of constructor arguments, got {type(obj).__name__}")


def label_config(cfg: Config, given: Given) -> list[str]:
    """Write what `given` replaces into `cfg` (in place): reward.function, agent.env / agent.agent and
    agent.tools name the objects, data.train_files / data.val_files the rows. Returns a note for each key
    whose own value (set in YAML or an override, not the schema's default) gives way."""
    for key in ("reward_fn", "agent_cls", "env_cls"):
        _callable(key, getattr(given, key))
    for key in ("agent_args", "env_args"):
        _mapping(key, getattr(given, key))
    if given.env_args is not None and given.env_cls is None and cfg.agent.env is None:
        raise ConfigError("env_args was given without an environment: pass env_cls too (or set agent.env)")
    if given.agent_args is not None and given.agent_cls is None and cfg.agent.agent is None:
        raise ConfigError("agent_args was given without an agent: pass agent_cls too (or set agent.agent)")
    notes: list[str] = []

    def put(key: str, value: Any, what: str) -> None:
        section_name, name = key.split(".")
        section = getattr(cfg, section_name)
        old, default = getattr(section, name), getattr(type(section)(), name)
        if old is not None and old != value and old != default:
            notes.append(f"{key}={old!r} gives way to the {what} passed in Python")
        setattr(section, name, value)

    if given.reward_fn is not None:
        put("reward.function", label(given.reward_fn), "reward_fn")
    if given.env_cls is not None:
        put("agent.env", label(given.env_cls), "env_cls")
    if given.agent_cls is not None:
        put("agent.agent", label(given.agent_cls), "agent_cls")
    if given.tools is not None:
        put("agent.tools", list(_tool_box(given.tools).tools), "tools")
    for key in ("train_data", "val_data"):  # rows at all, before anything loads (and in a dry run, which reads none)
        if getattr(given, key) is not None:
            check_rows_shape(getattr(given, key), key)
    if given.train_data is not None:
        put("data.train_files", _rows_label("train_data", given.train_data), "train_data")
    if given.val_data is not None:
        put("data.val_files", _rows_label("val_data", given.val_data), "val_data")
    return notes


def resolve_components(cfg: Config, given: Given | None = None) -> Components:
    """The run's objects: each one `given`, else imported from its key (once; errors name the key). With
    agent.env set, the reward function is neither imported nor checked (episodes are scored by their
    environment; `plan_run` notes a reward.function it ignores)."""
    given = given or Given()
    a = cfg.agent
    agent = None
    reward_fn = None
    if a.env is not None:
        env_cls = given.env_cls or load_function(str(a.env), "agent.env")
        agent_cls = given.agent_cls or load_function(str(a.agent), "agent.agent")
        if given.tools is not None:
            box = _tool_box(given.tools)
            tools = box if box.tools else None
        else:
            tools = ToolBox.from_specs(list(a.tools)) if a.tools else None
        agent = AgentParts(_bind(env_cls, given.env_args), _bind(agent_cls, given.agent_args), tools)
    elif given.reward_fn is not None:
        reward_fn = verl_reward(given.reward_fn, label(given.reward_fn), "reward_fn")
    elif cfg.reward.function is not None:
        reward_fn = verl_reward(load_function(cfg.reward.function), cfg.reward.function)
    return Components(reward_fn, agent, given.train_data, given.val_data)


def _bind(cls: Callable[..., Any], args: Mapping[str, Any] | None) -> Callable[[], Any]:
    return functools.partial(cls, **args) if args else cls
