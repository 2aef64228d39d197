"""Tests of torchrl_post/reward/judge_local.py: a co-hosted judge (an untrained tiny Qwen2 with the demo tokenizer)
scores or fails each sample, never raises, and reads its replies like the remote judge."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from torchrl_post.config.errors import ConfigError
from torchrl_post.reward.judge import JudgeConfig, JudgeTemplate
from torchrl_post.reward.judge_local import LocalJudge

TEMPLATE = JudgeTemplate("Q: {question}\nA: {response}\nRef: {ground_truth}\nCorrect?")
QUESTIONS = ["What is 2+3?", "Add 4 and 4.", "9+9=?", "Sum 1 and 0.", "Compute 7 plus 2."]
RESPONSES = ["5", "=8", "17", "", "9 "]
TRUTHS = ["5", "8", "18", "1", "9"]


def _judge(model: Path, **kw: Any) -> LocalJudge:
    kw = {"parser": "number", "scale": (0, 9), "max_tokens": 6, **kw}
    return LocalJudge(str(model), TEMPLATE, torch.device("cpu"), **kw)


@pytest.fixture(scope="module")
def judge(tiny_model: Path) -> LocalJudge:
    return _judge(tiny_model)


def _replying(judge: LocalJudge, monkeypatch: pytest.MonkeyPatch, replies: list[str], fail_call: int = 0) -> list[int]:
    """Make the judge's model answer `replies` in turn (as token ids after the prompt); its `fail_call`-th generate
    call (1-based) raises instead. Returns the rows of each call."""
    tok, calls = judge.tokenizer, []
    queue = list(replies)

    def generate(input_ids: torch.Tensor, **kw: Any) -> torch.Tensor:
        calls.append(len(input_ids))
        if len(calls) == fail_call:
            raise RuntimeError("CUDA out of memory (simulated)")
        texts = [queue.pop(0) for _ in range(len(input_ids))]
        new = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        width = max(map(len, new))
        tail = torch.tensor([n + [tok.pad_token_id] * (width - len(n)) for n in new])
        return torch.cat([input_ids, tail], dim=1)

    monkeypatch.setattr(judge.model, "generate", generate)
    return calls


def test_scores_are_in_range_or_failures(judge: LocalJudge) -> None:
    out = judge.score(QUESTIONS, RESPONSES, TRUTHS)  # an untrained judge: replies of random characters
    assert out.scores.dtype == torch.float32 and out.scores.shape == (5,) and out.failed.shape == (5,)
    assert ((out.scores >= 0) & (out.scores <= 1)).all()
    assert (out.scores[out.failed] == 0).all()
    assert out.parse_failures + out.errors == int(out.failed.sum()) and out.errors == 0 and out.retries == 0
    assert len(out.replies) == 5 and out.latency_s > 0


def test_replies_are_read_with_the_parser_and_counted(judge: LocalJudge, monkeypatch, caplog) -> None:
    _replying(judge, monkeypatch, ["9", "no score here", "4.5", "", "score 0"])
    with caplog.at_level(logging.WARNING):
        out = judge.score(QUESTIONS, RESPONSES, TRUTHS)
    assert out.scores.tolist() == [1.0, 0.0, 0.5, 0.0, 0.0]
    assert out.failed.tolist() == [False, True, False, True, False]
    assert (out.parse_failures, out.errors, out.first_error) == (2, 0, None)
    assert out.replies == ["9", "no score here", "4.5", "", "score 0"]
    assert "2 replies without a score" in caplog.text
    assert out.metrics()["reward/judge/parse_failures"] == 2.0


def test_a_label_judge_without_its_label_in_the_reply_fails_every_sample(tiny_model: Path) -> None:
    judge = _judge(tiny_model, parser="label", labels={"verdict-never-written": 1.0}, scale=None)
    out = judge.score(QUESTIONS, RESPONSES, TRUTHS)
    assert out.failed.all() and out.parse_failures == 5 and out.errors == 0 and out.scores.sum() == 0


def test_a_prompt_too_long_fails_only_its_sample(judge: LocalJudge, monkeypatch, caplog) -> None:
    limit = judge.max_prompt_tokens
    assert limit == 256 - 6  # the tiny model's max_position_embeddings minus max_tokens
    calls = _replying(judge, monkeypatch, ["3", "6"])
    long_question = "x" * 300
    with caplog.at_level(logging.WARNING):
        out = judge.score(["q", long_question, "q"], ["1", "2", "3"], ["1", "2", "3"])
    assert calls == [2]  # the long prompt never reached the model
    assert out.failed.tolist() == [False, True, False] and out.scores[[0, 2]].tolist() == pytest.approx([1 / 3, 2 / 3])
    assert (out.errors, out.parse_failures) == (1, 0)
    assert f"more than its max_position_embeddings minus max_tokens ({limit})" in (out.first_error or "")
    assert "judge failed on 1 of 3 samples" in caplog.text


def test_an_exception_while_generating_fails_its_chunk(tiny_model: Path, monkeypatch) -> None:
    judge = _judge(tiny_model, batch_size=2)
    calls = _replying(judge, monkeypatch, ["1", "2", "5"], fail_call=2)
    out = judge.score(QUESTIONS, RESPONSES, TRUTHS)  # chunks [0, 1], [2, 3] (raises), [4]
    assert calls == [2, 2, 1]
    assert out.failed.tolist() == [False, False, True, True, False]
    assert out.scores.tolist() == pytest.approx([1 / 9, 2 / 9, 0.0, 0.0, 5 / 9])
    assert (out.errors, out.parse_failures) == (2, 0)
    assert out.first_error == "RuntimeError: CUDA out of memory (simulated)"
    assert out.replies[2:4] == ["", ""]


def test_chunks_give_the_replies_of_one_batch(tiny_model: Path) -> None:
    """Greedy replies do not depend on how prompts (of different lengths, so differently padded) are chunked."""
    whole = _judge(tiny_model, batch_size=32).score(QUESTIONS, RESPONSES, TRUTHS)
    chunked = _judge(tiny_model, batch_size=2).score(QUESTIONS, RESPONSES, TRUTHS)
    single = _judge(tiny_model, batch_size=1).score(QUESTIONS, RESPONSES, TRUTHS)
    assert whole.replies == chunked.replies == single.replies
    assert any(whole.replies) and len(set(whole.replies)) > 1  # replies that could differ


def test_sampling_is_seeded_and_leaves_the_run_random_state(tiny_model: Path) -> None:
    state = torch.random.get_rng_state()
    first = _judge(tiny_model, temperature=1.0, seed=7)
    a = [first.score(QUESTIONS, RESPONSES, TRUTHS).replies for _ in range(2)]
    assert torch.equal(torch.random.get_rng_state(), state)
    again = _judge(tiny_model, temperature=1.0, seed=7).score(QUESTIONS, RESPONSES, TRUTHS).replies
    other = _judge(tiny_model, temperature=1.0, seed=8).score(QUESTIONS, RESPONSES, TRUTHS).replies
    assert again == a[0]  # the same seed: the same replies
    assert a[1] != a[0] and other != a[0]  # another call, or another seed: other samples


def test_prompts_with_and_without_a_chat_template(tiny_model: Path, tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A: 7"}]
    chat = _judge(tiny_model)
    want = chat.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat.tokenizer.decode(chat.prompt_ids(messages)) == want
    assert str(want).endswith("<|im_start|>assistant\n")

    plain_dir = tmp_path / "plain"
    shutil.copytree(tiny_model, plain_dir)
    (plain_dir / "chat_template.jinja").unlink()
    plain = _judge(plain_dir)
    assert not plain.tokenizer.chat_template
    assert plain.tokenizer.decode(plain.prompt_ids(messages)) == "Be brief.\nA: 7"


def test_a_reply_longer_than_the_judge_s_positions_is_a_config_error(tiny_model: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"reward.judge.max_tokens=1024 leaves no room .* max_position_embeddings=256"
    ):
        _judge(tiny_model, max_tokens=1024)  # JudgeConfig's default, for a judge with 256 positions


def test_from_config(tiny_model: Path) -> None:
    cfg = JudgeConfig(
        enable=True, model=str(tiny_model), template="{response} vs {ground_truth}?", parser="label",
        labels={"yes": 1.0, "no": 0.0}, scale=None, max_tokens=4, temperature=0.5,
    )  # fmt: skip
    with LocalJudge.from_config(cfg, torch.device("cpu"), batch_size=8) as judge:
        assert (judge.parser, judge.labels, judge.scale) == ("label", {"yes": 1.0, "no": 0.0}, None)
        assert (judge.max_tokens, judge.temperature, judge.batch_size) == (4, 0.5, 8)
        assert judge.template.text == "{response} vs {ground_truth}?" and judge.max_prompt_tokens == 252
        assert judge.model is not None and next(judge.model.parameters()).device == torch.device("cpu")
        assert next(judge.model.parameters()).dtype == torch.float32
    assert judge.model is None
