"""Tests of torchrl_post/reward/scoring.py: batch scoring with errors and timeouts, and resolving reward functions."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from tests.unit import reward_helpers
from tests.unit.error_helpers import _one_line
from torchrl_post.config.errors import ConfigError
from torchrl_post.reward.builtin import arithmetic, gsm8k, math_boxed
from torchrl_post.reward.scoring import resolve_reward_fn, score_batch

# --- score_batch --------------------------------------------------------------------------------------------


def _flaky(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "raise":
        raise RuntimeError("boom")
    if solution_str == "nan":
        return float("nan")
    if solution_str == "inf":
        return math.inf
    if solution_str == "dict":
        return {"score": 0.75, "acc": True, "format": 0.5, "note": "text"}
    return float(solution_str)


def test_score_batch_counts_errors_and_scores_them_zero():
    texts = ["1", "raise", "0.5", "nan", "inf", "2", "raise"]
    n = len(texts)
    out = score_batch(lambda source: _flaky, texts, ["x"] * n, ["s"] * n, [{}] * n)
    torch.testing.assert_close(out.scores, torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 2.0, 0.0]))
    assert out.errors == 4
    assert out.extra == {}


def test_score_batch_dict_results():
    texts = ["dict", "1", "dict"]
    out = score_batch(lambda source: _flaky, texts, ["x"] * 3, ["s"] * 3, [{}] * 3)
    torch.testing.assert_close(out.scores, torch.tensor([0.75, 1.0, 0.75]))
    assert out.errors == 0
    # numeric extras only (bool is an int), per sample: NaN where the sample returned no dict
    assert sorted(out.extra) == ["acc", "format"]
    nan = float("nan")
    torch.testing.assert_close(out.extra["acc"], torch.tensor([1.0, nan, 1.0]), equal_nan=True)
    torch.testing.assert_close(out.extra["format"], torch.tensor([0.5, nan, 0.5]), equal_nan=True)


def test_score_batch_dict_without_score_is_an_error():
    out = score_batch(lambda s: lambda *a: {"acc": 1.0}, ["a"], [None], ["s"], [{}])
    assert out.errors == 1
    assert out.scores.tolist() == [0.0]


def test_score_batch_passes_arguments_and_picks_fn_by_source():
    seen = []

    def fn_for(source):
        def fn(data_source, solution_str, ground_truth, extra_info=None):
            seen.append((source, data_source, solution_str, ground_truth, extra_info))
            return 10.0 if source == "a" else -1.0

        return fn

    out = score_batch(fn_for, ["r0", "r1"], ["g0", "g1"], ["a", "b"], [{"i": 0}, {"i": 1}])
    assert out.scores.tolist() == [10.0, -1.0]
    assert seen == [("a", "a", "r0", "g0", {"i": 0}), ("b", "b", "r1", "g1", {"i": 1})]


def test_score_batch_with_builtins():
    fn_for = resolve_reward_fn(None, {"arithmetic", "gsm8k"})
    out = score_batch(fn_for, ["7", "8", "#### 9"], ["7", "7", "9"], ["arithmetic", "arithmetic", "gsm8k"], [{}] * 3)
    assert out.scores.tolist() == [1.0, 0.0, 1.0]
    assert out.errors == 0


# --- a hanging reward function ------------------------------------------------------------------------------


def _hangs(data_source: str, solution_str: str, ground_truth: str, extra_info: object = None) -> float:
    if solution_str == "hang":
        while True:  # a reward function stuck in a loop, catching what it can
            try:
                time.sleep(10)
            except Exception:
                pass
    return 1.0


def test_hanging_reward_times_out_and_is_counted() -> None:
    start = time.monotonic()
    out = score_batch(lambda s: _hangs, ["ok", "hang", "ok"], ["1"] * 3, ["x"] * 3, [{}] * 3, timeout_s=0.2)
    assert time.monotonic() - start < 5
    assert out.scores.tolist() == [1.0, 0.0, 1.0]
    assert out.errors == 1


# --- resolve_reward_fn --------------------------------------------------------------------------------------


def test_resolve_import_path_used_for_every_source():
    reward_helpers.CALLS.clear()
    fn_for = resolve_reward_fn("tests.unit.reward_helpers:length_reward", {"arithmetic", "unknown_task"})
    for source in ("arithmetic", "unknown_task", "never_seen"):
        assert fn_for(source) is reward_helpers.length_reward
    out = score_batch(fn_for, ["abc", "de"], ["1", "2"], ["arithmetic", "unknown_task"], [{}, {"k": 1}])
    assert out.scores.tolist() == [3.0, 2.0]
    assert reward_helpers.CALLS == [("arithmetic", "abc", "1", {}), ("unknown_task", "de", "2", {"k": 1})]


def test_resolve_builtin_by_source():
    fn_for = resolve_reward_fn(None, {"arithmetic", "openai/gsm8k", "math"})
    assert fn_for("arithmetic") is arithmetic
    assert fn_for("openai/gsm8k") is gsm8k
    assert fn_for("math") is math_boxed


def test_resolve_unknown_source_without_function():
    with pytest.raises(ConfigError) as info:
        resolve_reward_fn(None, {"arithmetic", "my_task"})
    msg = str(info.value)
    assert "reward.function" in msg
    assert "my_task" in msg
    assert "\n" not in msg


def test_resolve_bad_module_path():
    with pytest.raises(ConfigError) as info:
        resolve_reward_fn("tests.unit.no_such_module:fn", {"arithmetic"})
    assert "reward.function" in str(info.value)
    assert "tests.unit.no_such_module" in str(info.value)


@pytest.mark.parametrize("attr", ["missing_fn", "NOT_A_FUNCTION"])
def test_resolve_missing_or_non_callable_attribute(attr):
    with pytest.raises(ConfigError) as info:
        resolve_reward_fn(f"tests.unit.reward_helpers:{attr}", {"arithmetic"})
    assert attr in str(info.value)


# --- reward modules -----------------------------------------------------------------------------------------


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _reward_error(function: str) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_reward_fn(function, {"arithmetic"})
    return _one_line(info)


def test_reward_module_with_a_syntax_error(module_dir: Path) -> None:
    (module_dir / "rw_syntax.py").write_text("def score(a, b, c, d=None):\n    return (1\n\nx = 1\n")
    msg = _reward_error("rw_syntax:score")
    assert msg.startswith("reward.function='rw_syntax:score': module 'rw_syntax' does not compile")
    assert f"{module_dir / 'rw_syntax.py'}:2" in msg


def test_reward_module_raising_at_import(module_dir: Path) -> None:
    (module_dir / "rw_raises.py").write_text("import os\n\nTABLE = {}\nLIMIT = TABLE['limit']\n")
    msg = _reward_error("rw_raises:score")
    assert "importing module 'rw_raises' raised KeyError: 'limit'" in msg
    assert f"{module_dir / 'rw_raises.py'}:4" in msg
    (module_dir / "rw_lib.py").write_text("import json\n\nCONFIG = json.loads('{oops')\n")
    msg = _reward_error("rw_lib:score")
    assert "raised JSONDecodeError" in msg and f"{module_dir / 'rw_lib.py'}:3" in msg  # the user's line, not json's
    (module_dir / "rw_exits.py").write_text("import sys\nsys.exit('no GPU for my reward')\n")
    assert "raised SystemExit: no GPU for my reward" in _reward_error("rw_exits:score")


def test_reward_module_missing_dependency(module_dir: Path) -> None:
    (module_dir / "rw_dep.py").write_text("import no_such_dependency_xyz\n")
    msg = _reward_error("rw_dep:score")
    assert "cannot import module 'rw_dep'" in msg and "no_such_dependency_xyz" in msg


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def score(solution_str, ground_truth):\n    return 1.0\n", "too many positional arguments"),
        ("def score(a, b, c, d, *, strict):\n    return 1.0\n", "missing a required argument: 'strict'"),
        ("def score(a, b, c, d, e):\n    return 1.0\n", "missing a required argument: 'e'"),
        ("def score(**kwargs):\n    return 1.0\n", "too many positional arguments"),
    ],
)
def test_reward_signature_that_cannot_take_verls_arguments(module_dir: Path, source: str, needle: str) -> None:
    name = f"rw_sig_{abs(hash(source))}"
    (module_dir / f"{name}.py").write_text(source)
    msg = _reward_error(f"{name}:score")
    assert "cannot take verl's four arguments (data_source, solution_str, ground_truth, extra_info)" in msg
    assert needle in msg


def test_async_reward_function(module_dir: Path) -> None:
    (module_dir / "rw_async.py").write_text("async def score(a, b, c, d=None):\n    return 1.0\n")
    assert "is an async function" in _reward_error("rw_async:score")


@pytest.mark.parametrize(
    "source",
    [
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
        "def score(*args):\n    return 1.0\n",
        "def score(a, b, c, d, e=0, **kw):\n    return 1.0\n",
        "class Score:\n    def __call__(self, a, b, c, d):\n        return 1.0\nscore = Score()\n",
    ],
)
def test_reward_signatures_that_fit(module_dir: Path, source: str) -> None:
    name = f"rw_ok_{abs(hash(source))}"
    (module_dir / f"{name}.py").write_text(source)
    fn = resolve_reward_fn(f"{name}:score", {"arithmetic"})("arithmetic")
    assert fn("arithmetic", "4", "4", {}) == 1.0


@pytest.mark.parametrize("function", [":score", "tests.unit.reward_helpers:"])
def test_reward_path_with_an_empty_side(function: str) -> None:
    assert "must look like package.module:function" in _reward_error(function)


def test_reward_function_from_a_file_path(tmp_path: Path) -> None:
    """verl's custom_reward_function.path is a .py file: `reward.function=path/to/file.py:name` loads it."""
    (tmp_path / "my_reward.py").write_text("def compute_score(a, b, c, d=None):\n    return float(b == c)\n")
    fn = resolve_reward_fn(f"{tmp_path / 'my_reward.py'}:compute_score", {"arithmetic"})("arithmetic")
    assert fn("arithmetic", "4", "4", {}) == 1.0
    assert "no such file" in _reward_error(f"{tmp_path / 'missing.py'}:compute_score")
