"""Tests of torchrl_post/data/dataset.py: data files -> rows -> tokenized prompts (images too), one-line DataErrors."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from tests.unit.error_helpers import _one_line
from tests.unit.vision_helpers import BLUE, RED
from torchrl_post.config.errors import DataError
from torchrl_post.config.schema import DataConfig
from torchrl_post.data.dataset import as_rows, load_prompts, prompts_from_rows, read_rows, truncate_prompt
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.multimodal.vision import VisionSpec, image_inputs, load_processor

ROWS = [
    {"prompt": "What is 1+2?", "answer": "3", "data_source": "arithmetic"},
    {"prompt": "Add 4 and 5.", "answer": "9", "data_source": "arithmetic"},
    {"prompt": "7+0=?", "answer": "7", "data_source": "other"},
]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _template_ids(tok, messages: list[dict[str, str]]) -> list[int]:
    return list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"])


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _data_error(fn, *args, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg, f"DataError must be one line: {msg!r}"
    return msg


# --- read_rows ----------------------------------------------------------------------------------------------


def test_read_rows_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n" + json.dumps(ROWS[2]) + "\n")
    assert read_rows(path) == ROWS  # the blank line is skipped


def test_read_rows_json_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS))
    assert read_rows(path) == ROWS


def test_read_rows_json_data_object(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"data": ROWS, "version": 1}))
    assert read_rows(path) == ROWS


def test_read_rows_csv(tmp_path):
    path = tmp_path / "d.csv"
    pd.DataFrame(ROWS).to_csv(path, index=False)
    assert read_rows(path) == ROWS


def test_read_rows_csv_keeps_strings(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\n1+1,02\nNA,\n")
    # dtype=str, no NA conversion: "02" stays a string, "NA" and "" are not NaN.
    assert read_rows(path) == [{"prompt": "1+1", "answer": "02"}, {"prompt": "NA", "answer": ""}]


def test_read_rows_parquet(tmp_path):
    path = tmp_path / "d.parquet"
    pd.DataFrame(ROWS).to_parquet(path)
    assert read_rows(path) == ROWS


def test_read_rows_parquet_nested_gives_python_types(tmp_path):
    rows = [
        {
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2"}],
            "reward_model": {"ground_truth": "4", "style": "rule"},
            "n": 3,
        }
    ]
    path = tmp_path / "d.parquet"
    pd.DataFrame(rows).to_parquet(path)
    got = read_rows(path)
    assert got == rows
    assert type(got[0]["messages"]) is list
    assert type(got[0]["messages"][0]) is dict
    assert type(got[0]["n"]) is int


def test_read_rows_same_rows_in_every_format(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", ROWS)
    (tmp_path / "b.json").write_text(json.dumps(ROWS))
    pd.DataFrame(ROWS).to_csv(tmp_path / "c.csv", index=False)
    pd.DataFrame(ROWS).to_parquet(tmp_path / "d.parquet")
    results = [read_rows(tmp_path / name) for name in ("a.jsonl", "b.json", "c.csv", "d.parquet")]
    assert all(r == ROWS for r in results)


# --- read_rows errors ---------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    msg = _data_error(read_rows, path)
    assert str(path) in msg


def test_malformed_jsonl_line_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + '\n{"prompt": "x", \n' + json.dumps(ROWS[1]) + "\n")
    msg = _data_error(read_rows, path)
    assert f"{path}:2:" in msg


def test_jsonl_line_not_an_object(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n[1, 2]\n")
    msg = _data_error(read_rows, path)
    assert f"{path}:2:" in msg


def test_non_utf8_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"prompt": "\xff\xfe", "answer": "1"}\n')
    msg = _data_error(read_rows, path)
    assert f"{path}:2:" in msg
    assert "UTF-8" in msg


def test_non_utf8_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'[{"prompt": "\xff", "answer": "1"}]')
    msg = _data_error(read_rows, path)
    assert str(path) in msg


def test_non_utf8_csv(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(b"prompt,answer\n\xff\xfe,1\n")
    msg = _data_error(read_rows, path)
    assert str(path) in msg


def test_json_not_a_list_of_objects(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"rows": ROWS}))
    msg = _data_error(read_rows, path)
    assert str(path) in msg


def test_unsupported_extension(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("hello\n")
    msg = _data_error(read_rows, path)
    assert str(path) in msg
    assert ".txt" in msg


# --- load_prompts -------------------------------------------------------------------------------------------


def test_load_prompts_string_prompts(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    ds = load_prompts([str(path)], DataConfig(), tok, "train")
    assert len(ds) == 3
    assert ds.prompt_ids == [_template_ids(tok, [{"role": "user", "content": r["prompt"]}]) for r in ROWS]
    assert ds.answers == ["3", "9", "7"]
    assert ds.data_sources == ["arithmetic", "arithmetic", "other"]
    assert ds.extra_infos == [{"index": 0}, {"index": 1}, {"index": 2}]
    assert ds.num_filtered == 0
    assert ds.files == [str(path)]


def test_load_prompts_template_wraps_the_text(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS[:1])
    ds = load_prompts([str(path)], DataConfig(), tok, "train")
    text = tok.decode(ds.prompt_ids[0])
    assert text == "<|im_start|>user\nWhat is 1+2?<|im_end|>\n<|im_start|>assistant\n"


def test_load_prompts_several_files_and_default_source(tmp_path, tok):
    a = _write_jsonl(tmp_path / "a.jsonl", [{"prompt": "1+1", "answer": "2"}])
    b = _write_jsonl(tmp_path / "b.jsonl", [{"prompt": "2+2", "answer": "4", "extra_info": {"id": "x"}}])
    ds = load_prompts([str(a), str(b)], DataConfig(default_data_source="mytask"), tok, "train")
    assert ds.answers == ["2", "4"]
    assert ds.data_sources == ["mytask", "mytask"]
    assert ds.extra_infos == [{"index": 0}, {"id": "x"}]


def test_load_prompts_chat_messages(tmp_path, tok):
    msgs = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "3+3"}]
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": msgs, "answer": "6"}])
    ds = load_prompts([str(path)], DataConfig(), tok, "train")
    assert ds.prompt_ids == [_template_ids(tok, msgs)]
    assert ds.answers == ["6"]


def test_load_prompts_messages_column(tmp_path, tok):
    msgs = [{"role": "user", "content": "5+1"}]
    path = _write_jsonl(tmp_path / "d.jsonl", [{"messages": msgs, "answer": "6"}])
    ds = load_prompts([str(path)], DataConfig(), tok, "train")
    assert ds.prompt_ids == [_template_ids(tok, msgs)]


def test_load_prompts_parquet_messages_and_nested_answer(tmp_path, tok):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2"}]
    rows = [
        {"messages": msgs, "reward_model": {"ground_truth": "4", "style": "rule"}, "data_source": "gsm8k"},
        {"messages": msgs[1:], "reward_model": {"ground_truth": "5", "style": "rule"}, "data_source": "gsm8k"},
    ]
    path = tmp_path / "d.parquet"
    pd.DataFrame(rows).to_parquet(path)
    ds = load_prompts([str(path)], DataConfig(answer_key="reward_model.ground_truth"), tok, "train")
    assert ds.prompt_ids == [_template_ids(tok, msgs), _template_ids(tok, msgs[1:])]
    assert ds.answers == ["4", "5"]
    assert ds.data_sources == ["gsm8k", "gsm8k"]


def test_load_prompts_without_chat_template(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS[:1])
    ds = load_prompts([str(path)], DataConfig(apply_chat_template=False), tok, "train")
    assert ds.prompt_ids == [tok("What is 1+2?", add_special_tokens=True)["input_ids"]]


def test_overlong_prompts_are_filtered(tmp_path, tok):
    rows = [{"prompt": "1+1", "answer": "2"}, {"prompt": "x" * 100, "answer": "0"}, {"prompt": "2+2", "answer": "4"}]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    limit = len(_template_ids(tok, [{"role": "user", "content": "1+1"}]))
    ds = load_prompts([str(path)], DataConfig(max_prompt_length=limit, filter_overlong_prompts=True), tok, "train")
    assert ds.num_filtered == 1
    assert ds.answers == ["2", "4"]
    assert all(len(ids) <= limit for ids in ds.prompt_ids)
    # index in extra_info is the row number in the file, not in the filtered set
    assert ds.extra_infos == [{"index": 0}, {"index": 2}]


def test_prompt_at_the_limit_is_kept(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}])
    limit = len(_template_ids(tok, [{"role": "user", "content": "1+1"}]))
    ds = load_prompts([str(path)], DataConfig(max_prompt_length=limit), tok, "train")
    assert len(ds) == 1
    with pytest.raises(DataError):
        load_prompts([str(path)], DataConfig(max_prompt_length=limit - 1), tok, "train")


def test_overlong_prompt_is_an_error_without_filtering(tmp_path, tok):
    rows = [{"prompt": "1+1", "answer": "2"}, {"prompt": "x" * 100, "answer": "0"}]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    cfg = DataConfig(max_prompt_length=32, filter_overlong_prompts=False)
    msg = _data_error(load_prompts, [str(path)], cfg, tok, "train")
    assert f"{path} row 2" in msg
    assert "data.max_prompt_length=32" in msg


# --- data.truncation ----------------------------------------------------------------------------------------


def test_truncate_prompt_by_hand():
    ids = list(range(1, 11))
    assert truncate_prompt(ids, 4, "left") == [7, 8, 9, 10]
    assert truncate_prompt(ids, 4, "right") == [1, 2, 3, 4]
    assert truncate_prompt(ids, 4, "middle") == [1, 2, 9, 10]
    assert truncate_prompt(ids, 5, "middle") == [1, 2, 8, 9, 10]  # verl: the end keeps the odd one
    assert truncate_prompt(ids, 10, "left") == ids and truncate_prompt(ids, 12, "error") == ids
    with pytest.raises(ValueError):
        truncate_prompt(ids, 4, "error")


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_overlong_prompts_are_cut_after_the_chat_template(tmp_path, tok, side):
    rows = [{"prompt": "1+1", "answer": "2"}, {"prompt": "x" * 30 + "2+2", "answer": "4"}]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    limit = 30
    full = _template_ids(tok, [{"role": "user", "content": rows[1]["prompt"]}])
    assert len(_template_ids(tok, [{"role": "user", "content": "1+1"}])) <= limit < len(full)
    cfg = DataConfig(max_prompt_length=limit, filter_overlong_prompts=False, truncation=side)
    ds = load_prompts([str(path)], cfg, tok, "train")
    assert ds.num_filtered == 0 and ds.answers == ["2", "4"]
    expected = {"left": full[-30:], "right": full[:30], "middle": full[:15] + full[-15:]}[side]
    assert ds.prompt_ids[1] == expected
    if side == "left":  # the end survives: the question and the generation prompt
        assert tok.decode(ds.prompt_ids[1]).endswith("2+2<|im_end|>\n<|im_start|>assistant\n")


def test_the_filter_goes_before_truncation(tmp_path, tok):
    """verl's order: data.filter_overlong_prompts=true drops the prompt before data.truncation sees it."""
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, {"prompt": "x" * 30, "answer": "0"}])
    ds = load_prompts([str(path)], DataConfig(max_prompt_length=30, truncation="left"), tok, "train")
    assert ds.num_filtered == 1 and ds.answers == ["2"]


def test_overlong_error_names_truncation(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x" * 30, "answer": "0"}])
    msg = _data_error(
        load_prompts, [str(path)], DataConfig(max_prompt_length=20, filter_overlong_prompts=False), tok, "t"
    )
    assert "data.truncation=left|right|middle" in msg and "data.filter_overlong_prompts=true" in msg


def test_empty_after_filtering(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x" * 100, "answer": "0"}])
    msg = _data_error(load_prompts, [str(path)], DataConfig(max_prompt_length=8), tok, "val")
    assert str(path) in msg
    assert "empty" in msg


def test_empty_file(tmp_path, tok):
    path = tmp_path / "d.jsonl"
    path.write_text("")
    msg = _data_error(load_prompts, [str(path)], DataConfig(), tok, "train")
    assert str(path) in msg


def test_missing_prompt_column(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": "1+1", "answer": "2"}])
    msg = _data_error(load_prompts, [str(path)], DataConfig(), tok, "train")
    assert f"{path} row 1" in msg
    assert "'prompt'" in msg


def test_missing_answer_column(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, {"prompt": "2+2", "solution": "4"}])
    msg = _data_error(load_prompts, [str(path)], DataConfig(), tok, "train")
    assert f"{path} row 2" in msg
    assert "'answer'" in msg


def test_missing_nested_answer(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "reward_model": {"style": "rule"}}])
    msg = _data_error(load_prompts, [str(path)], DataConfig(answer_key="reward_model.ground_truth"), tok, "train")
    assert str(path) in msg
    assert "reward_model.ground_truth" in msg


def test_null_answer_in_parquet(tmp_path, tok):
    path = tmp_path / "d.parquet"
    pd.DataFrame([{"prompt": "1+1", "answer": 2}, {"prompt": "2+2", "answer": None}]).to_parquet(path)
    msg = _data_error(load_prompts, [str(path)], DataConfig(), tok, "train")
    assert f"{path} row 2" in msg


def test_null_answer_in_jsonl(tmp_path, tok):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, {"prompt": "2+2", "answer": None}])
    msg = _data_error(load_prompts, [str(path)], DataConfig(), tok, "train")
    assert f"{path} row 2" in msg


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_empty_prompt_string(tmp_path, tok, prompt):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt, "answer": "2"}])
    msg = _data_error(load_prompts, [str(path)], DataConfig(), tok, "train")
    assert f"{path} row 1" in msg


@pytest.mark.parametrize("prompt", [5, [], [{"role": "user"}], ["hi"]])
def test_bad_prompt_type(tmp_path, tok, prompt):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt, "answer": "2"}])
    msg = _data_error(load_prompts, [str(path)], DataConfig(), tok, "train")
    assert f"{path} row 1" in msg


def test_load_prompts_missing_file(tmp_path, tok):
    path = tmp_path / "missing.parquet"
    msg = _data_error(load_prompts, [str(path)], DataConfig(), tok, "train")
    assert str(path) in msg


# --- bad rows: skipped and counted, or one line naming file and row -----------------------------------------


def test_bad_rows_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    good = json.dumps({"prompt": "1+1=?", "answer": "2"})
    path.write_bytes(
        (good + "\n" + "{not json\n" + json.dumps({"prompt": "", "answer": "1"}) + "\n").encode()
        + b'{"prompt": "\xff\xfe", "answer": "3"}\n'
        + (json.dumps({"prompt": 7, "answer": "1"}) + "\n" + good + "\n").encode()
    )
    tok = build_char_tokenizer()
    with pytest.raises(DataError, match=r"d.jsonl:2: malformed JSON"):
        load_prompts([str(path)], DataConfig(), tok, "train")
    ds = load_prompts([str(path)], DataConfig(skip_bad_rows=True), tok, "train")
    assert len(ds) == 2 and ds.num_bad == 4


def _prompts_error(files: list[Path], cfg: DataConfig, tok: Any) -> str:
    with pytest.raises(DataError) as info:
        load_prompts([str(f) for f in files], cfg, tok, "train")
    return _one_line(info)


def test_csv_row_with_a_missing_field(tmp_path: Path, tok: Any) -> None:
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer,data_source\n1+1,2,arithmetic\n"multi\nline",3,arithmetic\n2+2\n3+3,6,arithmetic\n')
    with pytest.raises(DataError) as info:
        read_rows(path)
    msg = _one_line(info)
    assert f"{path}:5:" in msg and "1 field(s) where the header has 3" in msg
    assert "no value for 'answer', 'data_source'" in msg
    ds = load_prompts([str(path)], DataConfig(skip_bad_rows=True), tok, "train")
    assert ds.answers == ["2", "3", "6"] and ds.num_bad == 1


def test_csv_row_with_an_extra_field(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\n1+1,2\nAdd 1, 2 and 3,6\n")
    with pytest.raises(DataError) as info:
        read_rows(path)
    msg = _one_line(info)
    assert f"{path}:3:" in msg and "3 field(s) where the header has 2" in msg and "quote" in msg


def test_csv_empty_quoted_field_is_read_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer,note\n1+1,2,""\n\n2+2,4,\n')
    assert read_rows(path) == [
        {"prompt": "1+1", "answer": "2", "note": ""},
        {"prompt": "2+2", "answer": "4", "note": ""},
    ]


def test_csv_header_problems(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer,answer\n1+1,2,3\n")
    with pytest.raises(DataError, match=r"d.csv:1: the header names column\(s\) \['answer'\] twice"):
        read_rows(path)
    path.write_text("")
    with pytest.raises(DataError, match="empty CSV file"):
        read_rows(path)


def test_csv_row_errors_name_the_line(tmp_path: Path, tok: Any) -> None:
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer\n"a\nb",1\n2+2,\n')
    msg = _prompts_error([path], DataConfig(), tok)
    assert f"{path} line 4: empty 'answer'" in msg


def test_unknown_chat_role(tmp_path: Path, tok: Any) -> None:
    good = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1"}]
    bad = [{"role": "user", "content": "1+1"}, {"role": "human", "content": "2+2"}]
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": good, "answer": "2"}, {"prompt": bad, "answer": "4"}])
    msg = _prompts_error([path], DataConfig(), tok)
    assert f"{path} row 2: column 'prompt' message 2 has role 'human'" in msg
    assert "system, user, assistant, tool" in msg
    ds = load_prompts([str(path)], DataConfig(skip_bad_rows=True), tok, "train")
    assert len(ds) == 1 and ds.num_bad == 1


def test_unknown_role_in_messages_column(tmp_path: Path, tok: Any) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "User", "content": "1+1"}], "answer": "2"}])
    assert "column 'messages' message 1 has role 'User'" in _prompts_error([path], DataConfig(), tok)


def test_tool_and_assistant_roles_are_fine(tmp_path: Path, tok: Any) -> None:
    msgs = [
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "calc"},
        {"role": "tool", "content": "2"},
        {"role": "user", "content": "so?"},
    ]
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": msgs, "answer": "2"}])
    assert len(load_prompts([str(path)], DataConfig(max_prompt_length=256), tok, "train")) == 1


def test_every_message_empty(tmp_path: Path, tok: Any) -> None:
    msgs = [{"role": "system", "content": ""}, {"role": "user", "content": "  "}]
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": msgs, "answer": "2"}])
    assert "every message in column 'prompt' is empty" in _prompts_error([path], DataConfig(), tok)


@pytest.mark.parametrize("answer", ["", "  \n"])
def test_empty_answer(tmp_path: Path, tok: Any, answer: str) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, {"prompt": "2+2", "answer": answer}])
    msg = _prompts_error([path], DataConfig(), tok)
    assert f"{path} row 2: empty 'answer'" in msg and "data.skip_bad_rows=true" in msg
    assert load_prompts([str(path)], DataConfig(skip_bad_rows=True), tok, "train").num_bad == 1


@pytest.mark.parametrize("source", [0, False, 3.5, ["a"]])
def test_data_source_that_is_not_a_string(tmp_path: Path, tok: Any, source: Any) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2", "data_source": source}])
    msg = _prompts_error([path], DataConfig(), tok)
    assert f"{path} row 1: column 'data_source' must be a string, got {type(source).__name__}" in msg


def test_empty_data_source_takes_the_default(tmp_path: Path, tok: Any) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2", "data_source": ""}])
    assert load_prompts([str(path)], DataConfig(), tok, "train").data_sources == ["arithmetic"]


def test_extra_info_that_is_not_an_object(tmp_path: Path, tok: Any) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2", "extra_info": '{"id": 1}'}])
    msg = _prompts_error([path], DataConfig(), tok)
    assert "column 'extra_info' must be an object" in msg and "got str" in msg


def test_jsonl_row_named_by_its_line_when_they_differ(tmp_path: Path, tok: Any) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+1", "answer": "2"}) + "\n\n" + json.dumps({"prompt": "2+2"}) + "\n")
    assert f"{path} row 2 (line 3): no 'answer' or 'reward_model.ground_truth' column" in _prompts_error(
        [path], DataConfig(), tok
    )


# --- rows with images ---------------------------------------------------------------------------------------


def _png(rgb: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), rgb).save(buf, format="PNG")
    return buf.getvalue()


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def qwen2_vl(tiny_vlms: dict[str, Path]) -> tuple[Path, Any]:
    return tiny_vlms["qwen2_vl"], load_processor(str(tiny_vlms["qwen2_vl"]))


def test_images_from_paths_bytes_and_dicts(qwen2_vl: tuple[Path, Any], tmp_path: Path) -> None:
    _, processor = qwen2_vl
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "red.png").write_bytes(_png(RED))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    # HF datasets' image dicts in parquet: a path (relative to the file's folder) or the bytes.
    frame = pd.DataFrame(
        {
            "prompt": ["<image>Colour?", "<image>Colour?"],
            "images": [[{"bytes": None, "path": "img/red.png"}], [{"bytes": _png(RED), "path": None}]],
            "answer": ["red", "red"],
        }
    )
    frame.to_parquet(tmp_path / "rows.parquet")
    (tmp_path / "img" / "blue.png").write_bytes(_png(BLUE))  # chat messages with an image item; a plain path
    rows = _jsonl(tmp_path / "rows.jsonl", [{"messages": messages, "images": ["img/blue.png"], "answer": "blue"}])
    files = [str(tmp_path / "rows.parquet"), rows]
    cfg = DataConfig(max_prompt_length=64)
    data = load_prompts(files, cfg, processor.tokenizer, "train", processor)
    assert len(data) == 3 and data.prompt_ids[0] == data.prompt_ids[1] == data.prompt_ids[2]
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert data.prompt_ids[0].count(image_pad) == 4  # a 4x4 patch grid merged 2x2
    assert torch.equal(data.mm_inputs[0]["pixel_values"], data.mm_inputs[1]["pixel_values"])  # path == bytes
    assert not torch.equal(data.mm_inputs[0]["pixel_values"], data.mm_inputs[2]["pixel_values"])  # red vs blue
    assert data.questions == ["Colour?"] * 3
    # return_multi_modal_inputs=false keeps only the images; the step's batch processes them to the same inputs.
    lazy = load_prompts(
        files,
        DataConfig(max_prompt_length=64, return_multi_modal_inputs=False),
        processor.tokenizer,
        "train",
        processor,
    )
    assert lazy.mm_inputs == [] and len(lazy.images) == 3
    again = image_inputs(processor, lazy.images[2])
    assert torch.equal(again["pixel_values"], data.mm_inputs[2]["pixel_values"])


def test_image_tokens_count_against_the_prompt_budget(qwen2_vl: tuple[Path, Any], tmp_path: Path) -> None:
    _, processor = qwen2_vl
    (tmp_path / "red.png").write_bytes(_png(RED))
    rows = [{"prompt": "<image>" + "x" * 10, "images": ["red.png"], "answer": "red"}] * 2
    rows.append({"prompt": "<image>short", "images": ["red.png"], "answer": "red"})
    path = _jsonl(tmp_path / "rows.jsonl", rows)
    template = processor.apply_chat_template(
        [{"role": "user", "content": "x" * 10}], add_generation_prompt=True, tokenize=False
    )
    text_only = len(processor.tokenizer(template)["input_ids"])
    limit = text_only + 3 + 1  # the text and the vision markers (start, one pad, end) fit; not 4 image tokens
    data = load_prompts([path], DataConfig(max_prompt_length=limit), processor.tokenizer, "train", processor)
    assert len(data) == 1 and data.num_filtered == 2
    with pytest.raises(DataError, match=r"rows.jsonl row 1: prompt is \d+ tokens with its images' tokens"):
        load_prompts(
            [path],
            DataConfig(max_prompt_length=limit, filter_overlong_prompts=False),
            processor.tokenizer,
            "t",
            processor,
        )


def test_truncation_never_cuts_image_tokens(qwen2_vl: tuple[Path, Any], tmp_path: Path) -> None:
    """A cut that keeps every vision token is made; one through them is an error naming data.truncation."""
    from transformers import AutoConfig

    path_, processor = qwen2_vl
    spec = VisionSpec.of(AutoConfig.from_pretrained(path_))
    assert spec is not None
    (tmp_path / "red.png").write_bytes(_png(RED))
    path = _jsonl(tmp_path / "rows.jsonl", [{"prompt": "<image>" + "x" * 10, "images": ["red.png"], "answer": "red"}])
    tokenizer = processor.tokenizer
    full = load_prompts([path], DataConfig(max_prompt_length=512), tokenizer, "t", processor).prompt_ids[0]
    first = min(j for j, t in enumerate(full) if t in spec.never_generated)
    last = max(j for j, t in enumerate(full) if t in spec.never_generated)

    def load(limit: int, side: str) -> list[int]:
        cfg = DataConfig(max_prompt_length=limit, filter_overlong_prompts=False, truncation=side)
        return load_prompts([path], cfg, tokenizer, "t", processor, vision_ids=spec.never_generated).prompt_ids[0]

    assert load(len(full) - first, "left") == full[first:]  # the text before the image goes
    assert load(last + 1, "right") == full[: last + 1]  # the text after it goes
    for limit, side in ((len(full) - first - 1, "left"), (last, "right"), (4, "middle")):
        with pytest.raises(DataError, match=rf"rows.jsonl row 1: data.truncation={side} would cut image tokens"):
            load(limit, side)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "Colour?", "images": ["red.png"]}, r"row 1: 1 images but 0 image placeholders"),
        ({"prompt": "<image><image>?", "images": ["red.png"]}, r"row 1: 1 images but 2 image placeholders"),
        ({"prompt": "<image>?", "images": ["missing.png"]}, r"row 1: cannot read image 'missing.png'"),
        ({"prompt": "<image>?", "images": [12]}, r"row 1: an image must be a file path, bytes"),
        ({"prompt": "<image><image>?", "images": ["red.png"] * 2}, r"2 images, over rollout.limit_images=1"),
    ],
    ids=["no-marker", "extra-marker", "missing-file", "not-an-image", "too-many"],
)
def test_bad_image_rows_name_the_row(
    qwen2_vl: tuple[Path, Any], tmp_path: Path, row: dict[str, Any], message: str
) -> None:
    _, processor = qwen2_vl
    (tmp_path / "red.png").write_bytes(_png(RED))
    path = _jsonl(tmp_path / "rows.jsonl", [{**row, "answer": "red"}])
    with pytest.raises(DataError, match=message):
        load_prompts([path], DataConfig(), processor.tokenizer, "train", processor)
    skipped = load_prompts(
        [path, _jsonl(tmp_path / "ok.jsonl", [{"prompt": "<image>?", "images": ["red.png"], "answer": "red"}])],
        DataConfig(skip_bad_rows=True),
        processor.tokenizer,
        "train",
        processor,
    )
    assert (len(skipped), skipped.num_bad) == (1, 1)


# --- rows passed in Python (the API's train_data / val_data) --------------------------------------------------


def _same(a: Any, b: Any) -> None:
    for name in ("prompt_ids", "answers", "data_sources", "extra_infos", "questions"):
        assert getattr(a, name) == getattr(b, name), name


def test_rows_in_memory_parse_like_file_rows(tmp_path: Path, tok: Any) -> None:
    rows = [*ROWS, {"messages": [{"role": "user", "content": "2+2=?"}], "answer": [4], "extra_info": {"id": 9}}]
    from_file = load_prompts([str(_write_jsonl(tmp_path / "d.jsonl", rows))], DataConfig(), tok, "train")
    from_list = prompts_from_rows(rows, "train_data", DataConfig(), tok, "train")
    _same(from_list, from_file)
    # A real datasets.Dataset, loaded as users load one (one type per column): its schema gives every row every
    # column (None where a row had none), and the numpy format gives numpy values.
    typed_path = _write_jsonl(tmp_path / "t.jsonl", [*ROWS, {**rows[-1], "answer": "4"}])
    typed_file = load_prompts([str(typed_path)], DataConfig(), tok, "train")
    hub = datasets.load_dataset("json", data_files=str(typed_path), split="train", cache_dir=str(tmp_path / "hf"))
    from_hub = prompts_from_rows(hub.with_format("numpy"), "train_data", DataConfig(), tok, "train")
    for ds in (prompts_from_rows(hub, "train_data", DataConfig(), tok, "train"), from_hub):
        _same(ds, typed_file)
    three = load_prompts([str(_write_jsonl(tmp_path / "e.jsonl", ROWS))], DataConfig(), tok, "train")
    _same(prompts_from_rows(pd.DataFrame(ROWS), "train_data", DataConfig(), tok, "train"), three)
    assert from_list.answers[3] == [4] and from_hub.extra_infos[3] == {"id": 9}  # numpy -> Python
    assert not isinstance(from_hub.extra_infos[3]["id"], np.ndarray)


def test_a_bad_row_in_memory_names_its_index(tok: Any) -> None:
    rows = [ROWS[0], {"prompt": "1+1=?"}, ROWS[1]]
    msg = _data_error(prompts_from_rows, rows, "train_data", DataConfig(), tok, "train")
    assert msg == "train_data[1]: no 'answer' or 'reward_model.ground_truth' column for the reward; set data.answer_key"
    msg = _data_error(prompts_from_rows, [ROWS[0], "1+1=?"], "val_data", DataConfig(), tok, "val")
    assert msg == "val_data[1]: a row must be a dict of columns, got str"
    ds = prompts_from_rows([ROWS[0], "1+1=?", *rows], "train_data", DataConfig(skip_bad_rows=True), tok, "train")
    assert len(ds) == 3 and ds.num_bad == 2 and ds.extra_infos[-1] == {"index": 4}  # indices in the list
    msg = _data_error(prompts_from_rows, "d.jsonl", "train_data", DataConfig(), tok, "train")
    assert msg.startswith("train_data is a path ('d.jsonl'); pass rows")
    msg = _data_error(prompts_from_rows, [], "train_data", DataConfig(), tok, "train")
    assert msg.startswith("train data train_data is empty after filtering")
    assert as_rows(iter([{"a": np.int64(3)}]), "rows") == [(0, {"a": 3})]


def test_images_in_memory_as_pil(qwen2_vl: tuple[Path, Any], tmp_path: Path) -> None:
    """PIL images in memory give the same tokens and pixels as the same image read from a file."""
    _, processor = qwen2_vl
    (tmp_path / "red.png").write_bytes(_png(RED))
    row = {"prompt": "<image>Colour?", "answer": "red"}
    cfg = DataConfig(max_prompt_length=64)
    from_file = load_prompts(
        [_jsonl(tmp_path / "rows.jsonl", [{**row, "images": ["red.png"]}])],
        cfg,
        processor.tokenizer,
        "train",
        processor,
    )
    pil = Image.open(io.BytesIO(_png(RED)))
    from_list = prompts_from_rows([{**row, "images": [pil]}], "train_data", cfg, processor.tokenizer, "t", processor)
    # a datasets.Dataset with an Image feature: its rows come decoded to PIL
    features = datasets.Features(
        {"prompt": datasets.Value("string"), "answer": datasets.Value("string"), "images": [datasets.Image()]}
    )
    hub = datasets.Dataset.from_list([{**row, "images": [{"bytes": _png(RED)}]}], features=features)
    from_hub = prompts_from_rows(hub, "train_data", cfg, processor.tokenizer, "t", processor)
    for ds in (from_list, from_hub):
        _same(ds, from_file)
        assert torch.equal(ds.mm_inputs[0]["pixel_values"], from_file.mm_inputs[0]["pixel_values"])
