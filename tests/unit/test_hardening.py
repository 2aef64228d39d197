"""Hardened inputs: a hanging reward function times out, bad rows can be skipped and counted, fault specs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from torchrl_post.config.errors import DataError
from torchrl_post.config.schema import DataConfig
from torchrl_post.data.dataset import load_prompts
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.faults import active
from torchrl_post.reward.scoring import score_batch


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


def test_fault_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not active("kill_during_save", 4, 0)
    monkeypatch.setenv("TORCHRL_POST_FAULT", "kill_during_save:4:1")
    assert active("kill_during_save", 4, 1) and not active("kill_during_save", 4, 0)
    assert not active("kill_during_save", 3, 1) and not active("nan_advantages", 4, 1)
    monkeypatch.setenv("TORCHRL_POST_FAULT", "nan_advantages:3+")
    assert [active("nan_advantages", s, 0) for s in (2, 3, 9)] == [False, True, True]
