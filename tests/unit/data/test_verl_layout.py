"""verl's own data: a parquet file in the layout of verl's example preprocessors (gsm8k's) loads with the default
data keys and is scored by the built-in gsm8k reward and by a function with verl's compute_score signature."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from torchrl_post.config.errors import DataError
from torchrl_post.config.schema import DataConfig
from torchrl_post.data.dataset import load_prompts
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.reward import resolve_reward_fn, score_batch

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
QUESTIONS = [("Tom has 3 apples and buys 4 more. How many?", "7"), ("What is 12 * 2?", "24")]
SEEN: list[tuple[Any, ...]] = []


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """A reward function as verl users write them: records its arguments, 1.0 when the truth ends the text."""
    SEEN.append((data_source, solution_str, ground_truth, extra_info))
    return float(solution_str.rstrip().endswith(ground_truth))


def _verl_gsm8k_rows() -> list[dict[str, Any]]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": "train", "index": i, "answer": f"... #### {truth}", "question": q},
        }
        for i, (q, truth) in enumerate(QUESTIONS)
    ]


@pytest.fixture(scope="module")
def verl_parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verl") / "train.parquet"
    pd.DataFrame(_verl_gsm8k_rows()).to_parquet(path)
    return path


def test_verl_parquet_loads_with_default_keys(verl_parquet: Path) -> None:
    ds = load_prompts([str(verl_parquet)], DataConfig(max_prompt_length=512), build_char_tokenizer(), "train")
    assert ds.answers == ["7", "24"]
    assert ds.data_sources == ["openai/gsm8k", "openai/gsm8k"]
    assert ds.extra_infos[1] == {"split": "train", "index": 1, "answer": "... #### 24", "question": QUESTIONS[1][0]}
    assert ds.questions[0].startswith("Tom has 3 apples")


def test_verl_parquet_scored_by_builtin_and_compute_score(verl_parquet: Path) -> None:
    ds = load_prompts([str(verl_parquet)], DataConfig(max_prompt_length=512), build_char_tokenizer(), "train")
    texts = ["3 + 4 = 7 apples.\n#### 7", "12 * 2 = 42\n#### 42"]
    builtin = resolve_reward_fn(None, set(ds.data_sources))  # openai/gsm8k -> the built-in gsm8k reward
    got = score_batch(builtin, texts, ds.answers, ds.data_sources, ds.extra_infos)
    assert got.scores.tolist() == [1.0, 0.0] and got.errors == 0
    SEEN.clear()
    custom = resolve_reward_fn(f"{__name__}:compute_score", set(ds.data_sources))
    got = score_batch(custom, texts, ds.answers, ds.data_sources, ds.extra_infos)
    assert got.scores.tolist() == [1.0, 0.0]
    assert SEEN[0] == ("openai/gsm8k", texts[0], "7", ds.extra_infos[0])  # extra_info as the file holds it


def test_answer_key_names_both_columns_when_neither_is_there(tmp_path: Path) -> None:
    rows = _verl_gsm8k_rows()
    rows[1]["reward_model"] = {"style": "rule"}
    path = tmp_path / "d.parquet"
    pd.DataFrame(rows).to_parquet(path)
    with pytest.raises(DataError) as info:
        load_prompts([str(path)], DataConfig(max_prompt_length=512), build_char_tokenizer(), "train")
    assert str(info.value) == (
        f"{path} row 2: no 'answer' or 'reward_model.ground_truth' column for the reward; set data.answer_key"
    )
    with pytest.raises(DataError, match="no 'solution' column"):  # a key of one's own: no fallback
        load_prompts([str(path)], DataConfig(answer_key="solution", max_prompt_length=512), build_char_tokenizer(), "t")
