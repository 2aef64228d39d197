"""TRL's and OpenRLHF's reward functions under verl's signature.

TRL's is a function of (completions, **kwargs) -> list; OpenRLHF's (its --reward.remote_url naming a .py file) of
(queries, prompts, labels) -> a tensor of rewards, or a dict with "rewards". Both are called here with a batch of
one.

TRL calls each reward function once per batch, by keyword: `completions` (one per sample), the dataset's other
columns as lists (`solution`, ...), and `prompts`, `completion_ids` and logging hooks. Here every sample is scored
on its own with verl's four arguments, so a TRL-style function (one with a `completions` or `completion_ids`
parameter and no `solution_str`) is wrapped (`as_verl_reward`) and called with a batch of one:

    fn(completions=[[{"role": "assistant", "content": solution_str}]],   # conversational: prompts are chat-templated
       solution=[ground_truth], ground_truth=[ground_truth], data_source=[data_source],
       **{key: [value] for key, value in extra_info.items()})

Its one value is the score; None (TRL's "skip this sample", which TRL's sum makes 0) scores 0. The scorer knows
neither the prompt nor the token ids: a function that needs `prompts` or `completion_ids` is refused up front.

OpenRLHF's is called `fn(queries=[solution_str], prompts=[""], labels=[ground_truth])`: its query is the prompt and
the response together, here the response alone (its examples read the answer from the end of the query).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torchrl_post.config.errors import ConfigError

TRL_PARAMS = ("completions", "completion_ids")
"""A parameter of these names (and no `solution_str`) marks a TRL-style reward function."""
UNKNOWN_HERE = ("prompts", "completion_ids")
"""TRL's arguments the per-sample scorer cannot give."""


def is_trl_style(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes TRL's arguments (`completions` / `completion_ids`) rather than verl's (`solution_str`)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return any(p in params for p in TRL_PARAMS) and "solution_str" not in params


class TrlReward:
    """A TRL-style reward function with verl's signature (the module docstring says how it is called)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
        columns = {k: [v] for k, v in (extra_info or {}).items()}
        columns |= {"solution": [ground_truth], "ground_truth": [ground_truth], "data_source": [data_source]}
        out = self.fn(completions=[[{"role": "assistant", "content": solution_str}]], **columns)
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            raise ValueError(f"a TRL reward function returns a list of one score per completion, got {out!r}")
        return 0.0 if out[0] is None else float(out[0])


class OpenRlhfReward:
    """An OpenRLHF reward function, (queries, prompts, labels) -> rewards, with verl's signature (module doc)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
        out = self.fn(queries=[solution_str], prompts=[""], labels=[ground_truth])
        if isinstance(out, dict):
            out = out["rewards"]
        values = out.reshape(-1).tolist() if hasattr(out, "reshape") else list(out)
        if len(values) != 1:
            raise ValueError(f"an OpenRLHF reward function returns one reward per query, got {out!r}")
        return float(values[0])


def is_openrlhf_style(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes OpenRLHF's arguments (`queries`, `labels`)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "queries" in params and "labels" in params and "solution_str" not in params


def as_verl_reward(fn: Callable[..., Any], path: str, key: str = "reward.function") -> Callable[..., Any]:
    """`fn` itself, or wrapped in `TrlReward` / `OpenRlhfReward` when it is TRL- / OpenRLHF-style; one that needs
    what the scorer cannot give (`prompts`, `completion_ids` without a default) is one ConfigError naming the key."""
    if is_openrlhf_style(fn):
        return OpenRlhfReward(fn)
    if not is_trl_style(fn):
        return fn
    params = inspect.signature(fn).parameters
    needed = [p for p in UNKNOWN_HERE if p in params and params[p].default is inspect.Parameter.empty]
    if needed:
        raise ConfigError(
            f"{key}={path!r} is a TRL reward function that needs {' and '.join(needed)}, which are not given here "
            "(each completion is scored alone from its text): give it a default, or write it as "
            "fn(data_source, solution_str, ground_truth, extra_info=None)"
        )
    return TrlReward(fn)
