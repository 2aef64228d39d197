"""The peers' reward settings here: TRL's built-in rewards (reward/builtin.py), TRL-signature reward functions
(reward/trl_signature.py), and the alias rows that bring verl's DAPO overlong keys, ROLL's reward_clip and TRL's
reward_funcs (config/alias_table.py), composed into a config and scored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.error_helpers import _one_line
from torchrl_post.components import Given, resolve_components
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_command_line, load_config
from torchrl_post.reward.builtin import accuracy_reward, reasoning_accuracy_reward, think_format_reward
from torchrl_post.reward.scoring import resolve_reward_fn, score_batch

# --- TRL's built-ins with verl's signature ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        (r"My answer is \boxed{\frac{1}{3}}", r"\frac{1}{3}", 1.0),  # TRL's docstring example
        (r"My answer is \boxed{\frac{1}{2}}", r"\frac{1}{3}", 0.0),
        (r"\boxed{12}", "12", 1.0),
        (r"first 3, then \boxed{12}", "12", 1.0),  # the boxed answer first, as TRL reads it
        ("The final answer is $12$", "12", 1.0),
        ("12", "12", 1.0),  # a plain answer (the demo's): TRL scores 0, here the number is read
        ("=12", "12", 1.0),
        ("13", "12", 0.0),
        (r"\boxed{13}", "12", 0.0),
        ("", "12", 0.0),
        ("12", "", 0.0),  # a ground truth math-verify cannot parse: TRL skips it (None), which sums to 0
    ],
)
def test_accuracy_reward(response: str, truth: str, expected: float) -> None:
    assert accuracy_reward("math", response, truth) == expected


def test_reasoning_accuracy_reward_reads_after_the_last_think() -> None:
    # TRL's docstring example: [1.0, 0.0, 0.0]
    right = r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}"
    wrong = r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}"
    unfinished = r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer"
    got = [reasoning_accuracy_reward("math", r, r"\frac{1}{3}") for r in (right, wrong, unfinished)]
    assert got == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>\nThis is my reasoning.\n</think>\nThis is my answer.", 1.0),  # TRL's docstring examples
        ("<think>\nThis is my reasoning.\nThis is my answer.", 0.0),
        ("I think. <think>x</think>", 0.0),
        ("<think>a</think><think>b</think>", 0.0),
    ],
)
def test_think_format_reward(response: str, expected: float) -> None:
    assert think_format_reward("any", response, "") == expected


# --- TRL-signature reward functions -------------------------------------------------------------------------

TRL_MODULE = """
def exact(completions, solution, **kwargs):
    return [1.0 if c[0]["content"].strip() == s else 0.0 for c, s in zip(completions, solution)]

def skips(completions, **kwargs):
    return [None for _ in completions]

def by_column(completions, difficulty, data_source, **kwargs):
    return [d * 10.0 + (source == "math") for d, source in zip(difficulty, data_source)]

def needs_prompts(prompts, completions, **kwargs):
    return [0.0 for _ in completions]

def two_values(completions, **kwargs):
    return [1.0, 2.0]
"""


@pytest.fixture
def trl_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "trl_style_rewards.py").write_text(TRL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "trl_style_rewards"


def _score(function: str, texts: list[str], answers: list[str], extra: dict | None = None) -> tuple[list, list]:
    fn_for = resolve_reward_fn(function, {"math"})
    out = score_batch(fn_for, texts, answers, ["math"] * len(texts), [dict(extra or {}) for _ in texts])
    return out.scores.tolist(), out.failed.tolist()


def test_a_trl_signature_function_gets_the_completion_and_the_ground_truth_as_its_solution(trl_module: str) -> None:
    assert _score(f"{trl_module}:exact", ["12", " 7 ", "3"], ["12", "7", "4"]) == ([1.0, 1.0, 0.0], [0.0] * 3)


def test_a_trl_none_scores_zero_without_an_error(trl_module: str) -> None:
    assert _score(f"{trl_module}:skips", ["a"], ["b"]) == ([0.0], [0.0])


def test_extra_info_keys_and_the_data_source_are_columns(trl_module: str) -> None:
    assert _score(f"{trl_module}:by_column", ["a"], ["b"], {"difficulty": 2}) == ([21.0], [0.0])


def test_a_trl_function_returning_other_than_one_value_is_a_counted_error(trl_module: str) -> None:
    assert _score(f"{trl_module}:two_values", ["a"], ["b"]) == ([0.0], [1.0])


def test_a_trl_function_that_needs_the_prompts_is_refused_in_one_line(trl_module: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_reward_fn(f"{trl_module}:needs_prompts", {"math"})
    msg = _one_line(info)
    assert "reward.function='trl_style_rewards:needs_prompts'" in msg and "needs prompts" in msg, msg


def test_a_trl_function_passed_in_python_is_adapted(trl_module: str) -> None:
    import trl_style_rewards  # type: ignore[import-not-found]

    parts = resolve_components(load_config([]), Given(reward_fn=trl_style_rewards.exact))
    assert parts.reward_fn is not None and parts.reward_fn("math", "12", "12", {}) == 1.0


# --- the alias rows -----------------------------------------------------------------------------------------


def test_trl_reward_funcs_accuracy_reward_scores_the_demo_data() -> None:
    notes: list[str] = []
    cfg = load_command_line(["--reward_funcs", "accuracy_reward"], notes)
    assert cfg.reward.function == "torchrl_post.reward.builtin:accuracy_reward"
    assert any(n.startswith("TRL's reward_funcs=accuracy_reward is reward.function=") for n in notes), notes
    fn_for = resolve_reward_fn(cfg.reward.function, {"arithmetic"})
    texts = ["12", r"\boxed{12}", "13", r"\boxed{7}", "=9"]
    answers = ["12", "12", "12", "12", "9"]
    scores = score_batch(fn_for, texts, answers, ["arithmetic"] * 5, [{}] * 5)
    assert scores.scores.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_trl_reward_funcs_with_the_soft_overlong_punishment_is_the_overlong_buffer() -> None:
    cfg = load_command_line(
        ["--reward_funcs", "think_format_reward", "get_soft_overlong_punishment", "--max_completion_length", "1280"]
    )
    ob = cfg.reward.overlong_buffer
    assert cfg.reward.function == "torchrl_post.reward.builtin:think_format_reward"
    assert (ob.enable, ob.len, ob.penalty_factor, ob.max_response_length) == (True, 256, 1.0, 1280)


def test_trl_reward_funcs_import_path_is_ours_with_a_colon() -> None:
    cfg = load_command_line(["--reward_funcs", "my_lib.rewards.custom_reward"])
    assert cfg.reward.function == "my_lib.rewards:custom_reward"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--reward_funcs", "accuracy_reward", "think_format_reward"], "write one that returns their sum"),
        (["--reward_funcs", "get_soft_overlong_punishment"], "name one with it"),
        (["--reward_funcs", "no_such_reward"], "accuracy_reward, reasoning_accuracy_reward, think_format_reward"),
        (["reward_model.reward_manager=prime"], "reward.overlong_buffer"),
    ],
)
def test_reward_aliases_refused_in_one_line(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_command_line(argv)
    msg = _one_line(info)
    assert needle in msg, msg


def test_verl_dapo_recipe_overlong_keys() -> None:
    # verl's recipe/dapo scripts (tests/peer_scripts/verl/run_dapo_qwen2.5_32b.sh)
    notes: list[str] = []
    cfg = load_config(
        [
            "reward_model.reward_manager=dapo",
            "reward_model.overlong_buffer.enable=True",
            "reward_model.overlong_buffer.len=128",
            "reward_model.overlong_buffer.penalty_factor=0.5",
            "reward_model.overlong_buffer.log=True",
            "data.max_response_length=2048",
        ],
        notes=notes,
    )
    ob = cfg.reward.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor, ob.max_response_length) == (True, 128, 0.5, None)
    assert any("reward_model.reward_manager=dapo accepted" in n for n in notes), notes


def test_newer_verl_reward_kwargs_overlong_keys() -> None:
    # verl's DAPO reward manager keys (tests/peer_scripts/verl/test_dapo_qwen3_30b_math.sh)
    cfg = load_config(
        [
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=512",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
            "+reward_model.reward_kwargs.max_resp_len=4096",
        ]
    )
    ob = cfg.reward.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor, ob.max_response_length) == (True, 512, 1.0, 4096)


def test_roll_reward_clip() -> None:
    assert load_config(["reward_clip=10"]).reward.clip == 10.0


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["reward.overlong_buffer.enable=true"], "reward.overlong_buffer.len=0 must be > 0"),
        (
            ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=600", "data.max_response_length=512"],
            "reward.overlong_buffer.len=600 must be <= the maximum length 512",
        ),
        (
            [
                "reward.overlong_buffer.enable=true",
                "reward.overlong_buffer.len=8",
                "reward.overlong_buffer.penalty_factor=-1",
            ],
            "penalty_factor=-1.0 must be >= 0",
        ),
        (["reward.clip=0"], "reward.clip=0.0 must be > 0"),
    ],
)
def test_shaping_keys_checked_in_one_line(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    msg = _one_line(info)
    assert needle in msg, msg


# --- OpenRLHF's reward function files (--reward.remote_url naming a .py) ---------------------------------------------


def test_an_openrlhf_reward_func_file_scores_each_response_against_its_label() -> None:
    # the stand-in beside OpenRLHF's DAPO script: 1.0 where the query ends with its label, in OpenRLHF's dict
    path = Path(__file__).parents[2] / "peer_scripts" / "openrlhf" / "reward_func.py"
    assert _score(f"{path}:reward_func", ["the sum is 12", "7", "x"], ["12", "8", "x"]) == ([1.0, 0.0, 1.0], [0.0] * 3)
