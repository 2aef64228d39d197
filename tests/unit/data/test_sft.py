"""Tests of torchrl_post/data/sft.py and rollout/supervised.py: SFT rows -> prompt, response and the mask of the
assistant tokens; lengths; one-line errors; the batch the actor trains on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.unit.error_helpers import _one_line
from torchrl_post.algos.policy_loss import agg_loss, nll_loss
from torchrl_post.config.errors import DataError
from torchrl_post.config.schema import DataConfig, SftConfig
from torchrl_post.data.sft import load_sft
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.rollout.supervised import sft_batch


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _write(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _text(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_a_prompt_response_row_trains_on_the_assistant_turn_and_its_end_token_only(tok, tmp_path: Path) -> None:
    path = _write(tmp_path, [{"prompt": "1+2=?", "response": "3"}])
    data = load_sft([path], DataConfig(max_response_length=8), SftConfig(), tok, "train")
    prompt, response, mask = data.prompt_ids[0], data.response_ids[0], data.response_masks[0]
    # the prompt is exactly what an RL run would prompt with (the template's generation prompt included)
    gen = tok.apply_chat_template([{"role": "user", "content": "1+2=?"}], tokenize=True, add_generation_prompt=True)
    assert prompt == list(gen["input_ids"])
    # "3", the end-of-turn token, then the template's newline, which the model never generates: not trained
    assert _text(tok, response) == "3<|im_end|>\n"
    assert mask == [1, 1, 0]
    assert data.answers == ["3"] and data.data_sources == ["arithmetic"]


def test_a_conversation_trains_on_every_assistant_turn_and_nothing_else(tok, tmp_path: Path) -> None:
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": "4"},
    ]
    path = _write(tmp_path, [{"messages": msgs}])
    data = load_sft([path], DataConfig(max_response_length=64), SftConfig(), tok, "train")
    response, mask = data.response_ids[0], data.response_masks[0]
    trained = _text(tok, [t for t, m in zip(response, mask, strict=True) if m])
    assert trained == "2<|im_end|>4<|im_end|>"
    # the whole conversation is the prompt and the response, in the template's rendering
    full = tok.apply_chat_template(msgs, tokenize=False)
    assert _text(tok, data.prompt_ids[0] + response) == full
    assert _text(tok, data.prompt_ids[0]).endswith("1+1<|im_end|>\n<|im_start|>assistant\n")
    assert data.answers == ["4"]


def test_a_long_response_is_cut_and_counted_or_refused_with_its_row(tok, tmp_path: Path) -> None:
    path = _write(tmp_path, [{"prompt": "p", "response": "1234567890"}, {"prompt": "q", "response": "1"}])
    data = load_sft([path], DataConfig(max_response_length=4), SftConfig(), tok, "train")
    assert data.num_truncated == 1
    assert [len(r) for r in data.response_ids] == [4, 3]
    assert _text(tok, data.response_ids[0]) == "1234"
    with pytest.raises(DataError) as e:
        load_sft([path], DataConfig(max_response_length=4), SftConfig(truncation="error"), tok, "train")
    _one_line(e)
    assert f"{path} row 1" in str(e.value) and "sft.truncation=right" in str(e.value)


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "has no assistant turn"),
        ({"prompt": "hi"}, "no 'response' column (sft.response_key)"),
        ({"prompt": "hi", "response": ""}, "'response' (sft.response_key) must be a non-empty string"),
    ],
)
def test_bad_rows_are_one_line_naming_file_row_and_key(tok, tmp_path: Path, row: dict, says: str) -> None:
    path = _write(tmp_path, [{"prompt": "ok", "response": "1"}, row])
    with pytest.raises(DataError) as e:
        load_sft([path], DataConfig(), SftConfig(), tok, "train")
    _one_line(e)
    assert f"{path} row 2" in str(e.value) and says in str(e.value)
    skipped = load_sft([path], DataConfig(skip_bad_rows=True), SftConfig(), tok, "train")
    assert len(skipped) == 1 and skipped.num_bad == 1


def test_rows_in_python_and_the_answer_column_as_response(tok) -> None:
    rows = [{"prompt": "2+2=?", "answer": "4"}, {"prompt": "3+3=?", "answer": "6"}]
    data = load_sft([], DataConfig(), SftConfig(response_key="answer"), tok, "train", rows=rows)
    assert [_text(tok, r) for r in data.response_ids] == ["4<|im_end|>\n", "6<|im_end|>\n"]


def test_the_batch_and_its_loss_are_the_mean_nll_of_the_trained_tokens(tok) -> None:
    rows = [{"prompt": "a", "response": "12"}, {"prompt": "bbbb", "response": "3"}]
    data = load_sft([], DataConfig(), SftConfig(), tok, "train", rows=rows)
    batch = sft_batch(data, [0, 1], [0, 1], tok.pad_token_id, live=[True, False])
    # prompts left-padded, responses right-padded, as an RL batch (types.py)
    assert batch.prompt_width == max(len(p) for p in data.prompt_ids)
    assert batch.loss_mask.tolist() == [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # row 2 not live: weight 0
    assert torch.equal(batch.responses[0, :4], torch.tensor(data.response_ids[0]))
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.8, 0.1], [0.1, 0.1, 0.1, 0.1]]))
    out = nll_loss(logp)
    loss = agg_loss(out.loss_bt, batch.loss_mask, "token-mean")
    expected = -(torch.log(torch.tensor(0.5)) + torch.log(torch.tensor(0.25)) + torch.log(torch.tensor(0.8))) / 3
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
