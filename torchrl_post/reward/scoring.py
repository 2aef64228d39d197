"""Resolve reward functions and score decoded responses.

A reward function takes (data_source, solution_str, ground_truth, extra_info) and returns a float, or a
dict with a "score" key (other numeric keys are averaged into reward/<key> metrics); one written for TRL
((completions, **kwargs) -> list) is wrapped to take them (reward/trl_signature.py). One that raises or
returns NaN/inf gives that sample 0; the count goes to `reward/errors` and training goes on.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import math
import signal
import sysconfig
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchrl_post.config.errors import ConfigError
from torchrl_post.reward.builtin import BUILTIN_BY_SOURCE
from torchrl_post.reward.trl_signature import as_verl_reward

log = logging.getLogger(__name__)
RewardFn = Callable[..., Any]


VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""What a reward function is called with, positionally (verl's signature)."""


def _raised_at(e: BaseException) -> str:
    """` at file:line` where an exception was raised: the innermost frame in the user's code (not importlib, the
    standard library or an installed package), else the innermost frame."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<frozen")]
    paths = sysconfig.get_paths()
    installed = tuple({str(Path(paths[k]).resolve()) for k in ("stdlib", "purelib", "platlib")})
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(installed)]
    if not frames:
        return ""
    frame = (own or frames)[-1]
    return f" at {frame.filename}:{frame.lineno}"


def _import(module_name: str) -> Any:
    """A module by import path, or (verl's custom_reward_function.path) by the path of its .py file."""
    if not module_name.endswith(".py"):
        return importlib.import_module(module_name)
    file = Path(module_name).expanduser()
    if not file.is_file():
        raise ImportError(f"no such file {file}")
    spec = importlib.util.spec_from_file_location(f"_reward_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_function(path: str, key: str = "reward.function") -> RewardFn:
    """Import `package.module:function` (or `path/to/file.py:function`, as verl's custom_reward_function); whatever
    goes wrong (no module, a syntax error or an exception while importing it, no such attribute) is one
    ConfigError naming the key, the module and where."""
    module_name, _, attr = path.rpartition(":")
    if not module_name or not attr:
        raise ConfigError(f"{key}={path!r} must look like package.module:function")
    try:
        module = _import(module_name)
    except SyntaxError as e:  # the module's own (or one it imports): file and line
        raise ConfigError(
            f"{key}={path!r}: module {module_name!r} does not compile: {e.msg} at {e.filename}:{e.lineno}"
        ) from e
    except ImportError as e:
        raise ConfigError(f"{key}={path!r}: cannot import module {module_name!r} ({' '.join(str(e).split())})") from e
    except (Exception, SystemExit) as e:  # code run at import raised
        msg = " ".join(str(e).split())
        raise ConfigError(
            f"{key}={path!r}: importing module {module_name!r} raised {type(e).__name__}"
            f"{': ' + msg if msg else ''}{_raised_at(e)}"
        ) from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{key}={path!r}: module {module_name!r} has no function {attr!r}")
    return fn


def check_reward_signature(fn: RewardFn, path: str, key: str = "reward.function") -> None:
    """The function takes verl's four arguments positionally and is not a coroutine (it is called, not awaited)."""
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{key}={path!r} is an async function; reward functions are called, not awaited: make it def")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: found out per sample
        return
    try:
        sig.bind(*VERL_ARGS)
    except TypeError as e:
        raise ConfigError(
            f"{key}={path!r}: signature {sig} cannot take verl's four arguments ({', '.join(VERL_ARGS)}): {e}; "
            "define it as fn(data_source, solution_str, ground_truth, extra_info=None)"
        ) from e


def verl_reward(fn: RewardFn, path: str, key: str = "reward.function") -> RewardFn:
    """`fn` as the scorer calls it: a TRL-style function wrapped (reward/trl_signature.py), verl's signature
    checked."""
    fn = as_verl_reward(fn, path, key)
    check_reward_signature(fn, path, key)
    return fn


def resolve_reward_fn(function: str | None, data_sources: set[str]) -> Callable[[str], RewardFn]:
    """data_source -> reward function; imported and its signature checked up front, for every data source."""
    fn = None
    if function is not None:
        fn = verl_reward(load_function(function), function)
    return reward_for_sources(fn, data_sources)


def reward_for_sources(fn: RewardFn | None, data_sources: set[str]) -> Callable[[str], RewardFn]:
    """data_source -> reward function: `fn` for every source, or (None) each source's built-in, which every
    source in `data_sources` must have."""
    if fn is not None:
        return lambda source: fn
    missing = sorted(s for s in data_sources if s not in BUILTIN_BY_SOURCE)
    if missing:
        raise ConfigError(
            f"no built-in reward for data_source {missing}; set reward.function=package.module:function "
            f"(built-ins: {', '.join(sorted(BUILTIN_BY_SOURCE))})"
        )
    return BUILTIN_BY_SOURCE.__getitem__


class RewardTimeout(BaseException):  # not Exception: a reward function catching Exception must not swallow it
    pass


def _raise_timeout(signum: int, frame: Any) -> None:
    raise RewardTimeout


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block after `seconds` (SIGALRM; main thread only, elsewhere no limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Scores:
    scores: torch.Tensor  # [B]
    failed: torch.Tensor  # [B] 1.0 where the function raised, timed out or returned a non-finite value
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """[B] per numeric key of returned dicts besides "score"; NaN for samples that did not return it."""

    @property
    def errors(self) -> int:
        return int(self.failed.sum().item())


def score_batch(
    fn_for: Callable[[str], RewardFn],
    texts: list[str],
    answers: list[Any],
    data_sources: list[str],
    extra_infos: list[dict[str, Any]],
    timeout_s: float = 0.0,
) -> Scores:
    n = len(texts)
    out = Scores(torch.zeros(n), torch.zeros(n))
    for i, (text, answer, source, extra) in enumerate(zip(texts, answers, data_sources, extra_infos, strict=True)):
        try:
            with time_limit(timeout_s):
                result = fn_for(source)(source, text, answer, extra)
            if isinstance(result, dict):
                for k, v in result.items():
                    if k != "score" and isinstance(v, (int, float)):
                        out.extra.setdefault(k, torch.full((n,), float("nan")))[i] = float(v)
                result = result["score"]
            value = float(result)
            if not math.isfinite(value):
                raise ValueError(f"non-finite reward {value}")
        except (Exception, RewardTimeout) as e:  # a user's reward function may raise anything; count it, go on
            if out.errors == 0:
                why = f"timed out after {timeout_s}s (reward.timeout_s)" if isinstance(e, RewardTimeout) else repr(e)
                log.warning("reward function failed on a %s sample (scored 0): %s", source, why)
            out.failed[i] = 1.0
            value = 0.0
        out.scores[i] = value
    return out
