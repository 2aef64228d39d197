"""Data files -> rows -> tokenized prompts, one-line DataErrors, and the resumable sharded sampler."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from torchrl_post.config.errors import DataError
from torchrl_post.config.schema import DataConfig
from torchrl_post.data.dataset import load_prompts, read_rows
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.demo.tokenizer import build_char_tokenizer

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


# --- ShardedBatchSampler ------------------------------------------------------------------------------------


def test_sampler_ranks_split_the_global_batch():
    s0 = ShardedBatchSampler(40, 8, dp_rank=0, dp_size=2, seed=3)
    s1 = ShardedBatchSampler(40, 8, dp_rank=1, dp_size=2, seed=3)
    full = ShardedBatchSampler(40, 8, dp_rank=0, dp_size=1, seed=3)
    for _ in range(7):  # crosses an epoch boundary (5 batches per epoch)
        idx0, pos0 = s0.next_batch()
        idx1, pos1 = s1.next_batch()
        global_idx, global_pos = full.next_batch()
        assert pos0 == [0, 1, 2, 3] and pos1 == [4, 5, 6, 7]
        assert global_pos == list(range(8))
        assert len(idx0) == len(idx1) == 4
        assert not set(idx0) & set(idx1)
        assert idx0 + idx1 == global_idx


def test_sampler_epoch_covers_every_index_once():
    s = ShardedBatchSampler(20, 4, dp_rank=0, dp_size=1, seed=0)
    assert s.batches_per_epoch == 5
    seen = [i for _ in range(5) for i in s.next_batch()[0]]
    assert sorted(seen) == list(range(20))


def test_sampler_drops_the_remainder():
    s = ShardedBatchSampler(10, 4, dp_rank=0, dp_size=1, seed=0)
    assert s.batches_per_epoch == 2
    first = [i for _ in range(2) for i in s.next_batch()[0]]
    assert len(set(first)) == 8
    s.next_batch()
    assert s.state_dict()["epoch"] == 1


def test_sampler_epochs_reshuffle():
    s = ShardedBatchSampler(32, 32, dp_rank=0, dp_size=1, seed=0)
    e0 = s.next_batch()[0]
    e1 = s.next_batch()[0]
    assert sorted(e0) == sorted(e1) == list(range(32))
    assert e0 != e1
    assert s.state_dict()["epoch"] == 1


def test_sampler_seed_changes_order():
    a = ShardedBatchSampler(32, 32, dp_rank=0, dp_size=1, seed=0).next_batch()[0]
    b = ShardedBatchSampler(32, 32, dp_rank=0, dp_size=1, seed=1).next_batch()[0]
    c = ShardedBatchSampler(32, 32, dp_rank=0, dp_size=1, seed=0).next_batch()[0]
    assert a != b
    assert a == c


def test_sampler_without_shuffle_is_in_order():
    s = ShardedBatchSampler(8, 4, dp_rank=1, dp_size=2, seed=0, shuffle=False)
    assert s.next_batch() == ([2, 3], [2, 3])
    assert s.next_batch() == ([6, 7], [2, 3])
    assert s.next_batch() == ([2, 3], [2, 3])


def test_sampler_resume_draws_the_same_sequence():
    s = ShardedBatchSampler(30, 6, dp_rank=1, dp_size=2, seed=7)  # 5 batches per epoch
    for _ in range(5):
        s.next_batch()
    state = s.state_dict()
    expected = [s.next_batch() for _ in range(3)]
    fresh = ShardedBatchSampler(30, 6, dp_rank=1, dp_size=2, seed=7)
    fresh.load_state_dict(dict(state))
    assert [fresh.next_batch() for _ in range(3)] == expected
    assert fresh.state_dict() == s.state_dict()


def test_sampler_resume_mid_epoch():
    s = ShardedBatchSampler(30, 6, dp_rank=0, dp_size=1, seed=7)
    for _ in range(2):
        s.next_batch()
    state = s.state_dict()
    assert state == {"epoch": 0, "batch_in_epoch": 2, "num_items": 30}
    expected = [s.next_batch() for _ in range(4)]
    fresh = ShardedBatchSampler(30, 6, dp_rank=0, dp_size=1, seed=7)
    fresh.load_state_dict(state)
    assert [fresh.next_batch() for _ in range(4)] == expected


def test_sampler_load_with_different_dataset_size():
    s = ShardedBatchSampler(30, 6, dp_rank=0, dp_size=1, seed=7)
    s.next_batch()
    other = ShardedBatchSampler(31, 6, dp_rank=0, dp_size=1, seed=7)
    with pytest.raises(ValueError, match=re.escape("30")):
        other.load_state_dict(s.state_dict())


def test_sampler_dataset_smaller_than_batch():
    s = ShardedBatchSampler(3, 4, dp_rank=0, dp_size=1, seed=0)
    with pytest.raises(ValueError):
        s.next_batch()
