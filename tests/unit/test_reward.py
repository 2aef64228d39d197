"""Built-in reward functions, batch scoring with error counting, and reward function resolution."""

import math

import pytest
import torch

from torchrl_post.config.errors import ConfigError
from torchrl_post.reward.builtin import BUILTIN_BY_SOURCE, arithmetic, gsm8k, last_boxed, math_boxed
from torchrl_post.reward.scoring import resolve_reward_fn, score_batch

from . import reward_helpers

# --- built-ins ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("12", "12", 1.0),
        (" 12 ", "12", 1.0),
        ("\n12\n", "12", 1.0),
        ("-3", "-3", 1.0),
        ("12a", "12", 0.0),
        ("13", "12", 0.0),
        ("", "12", 0.0),
        ("1 2", "12", 0.0),
        ("12.0", "12", 0.0),
    ],
)
def test_arithmetic(response, truth, expected):
    assert arithmetic("arithmetic", response, truth) == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so 1000 + 234 = 1,234\n#### 1,234", "1234", 1.0),
        ("#### 7", "7", 1.0),
        ("#### 7", "#### 7", 1.0),  # ground truth given as a full gsm8k solution
        ("#### 3\nwait, no\n#### 7", "7", 1.0),  # the last #### counts
        ("#### 7\nwait\n#### 3", "7", 0.0),
        ("#### 8", "7", 0.0),
        ("the answer is 1234", "1234", 0.0),  # no ####
        ("#### -2.5", "-2.5", 1.0),
    ],
)
def test_gsm8k(response, truth, expected):
    assert gsm8k("openai/gsm8k", response, truth) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{3}", "3"),
        ("first \\boxed{1}, finally \\boxed{\\frac{a}{b+{c}}} done", "\\frac{a}{b+{c}}"),
        ("\\boxed{{}}", "{}"),
        ("no box here", None),
        ("\\boxed{unbalanced", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_math_boxed():
    assert math_boxed("math", "The answer is $\\boxed{\\frac{1}{2}}$", "0.5") == 1.0
    assert math_boxed("math", "\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert math_boxed("math", "\\boxed{\\frac{1}{3}}", "0.5") == 0.0
    assert math_boxed("math", "the answer is 0.5", "0.5") == 0.0  # no box
    assert math_boxed("math", "\\boxed{4}", "\\boxed{4}") == 1.0


def test_builtins_by_source():
    assert BUILTIN_BY_SOURCE["arithmetic"] is arithmetic
    assert BUILTIN_BY_SOURCE["openai/gsm8k"] is gsm8k
    assert BUILTIN_BY_SOURCE["lighteval/MATH"] is math_boxed


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
