"""Tests of torchrl_post/reward/builtin.py: the built-in reward functions."""

import pytest

from torchrl_post.reward.builtin import BUILTIN_BY_SOURCE, arithmetic, gsm8k, last_boxed, math_boxed

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
