"""Tests of torchrl_post/reward/judge_local.py: a co-hosted judge (an untrained tiny Qwen2 with the demo tokenizer)
on an engine of its own (the hf engine here; the vllm engine runs in tests/e2e/test_rewards.py) scores or fails each
sample, never raises, and reads its replies like the remote judge."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from torchrl_post.build import local_judge
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import JudgeConfig
from torchrl_post.plan import plan_run
from torchrl_post.reward.judge_local import LocalJudge

TEMPLATE = "Q: {question}\nA: {response}\nRef: {ground_truth}\nCorrect?"
QUESTIONS = ["What is 2+3?", "Add 4 and 4.", "9+9=?", "Sum 1 and 0.", "Compute 7 plus 2."]
RESPONSES = ["5", "=8", "17", "", "9 "]
TRUTHS = ["5", "8", "18", "1", "9"]


def _judge(model: Path, seed: int = 0, **kw: Any) -> LocalJudge:
    fields = {"parser": "number", "scale": [0.0, 9.0], "max_tokens": 6, "engine": "hf", "template": TEMPLATE, **kw}
    return local_judge(JudgeConfig(enable=True, model=str(model), **fields), seed=seed)


@pytest.fixture(scope="module")
def judge(tiny_model: Path) -> LocalJudge:
    return _judge(tiny_model)


def test_scores_are_in_range_or_failures(judge: LocalJudge) -> None:
    out = judge.score(QUESTIONS, RESPONSES, TRUTHS)  # an untrained judge: replies of random characters
    assert out.scores.dtype == torch.float32 and out.scores.shape == (5,) and out.failed.shape == (5,)
    assert ((out.scores >= 0) & (out.scores <= 1)).all()
    assert (out.scores[out.failed] == 0).all()
    assert out.parse_failures + out.errors == int(out.failed.sum()) and out.errors == 0 and out.retries == 0
    assert len(out.replies) == 5 and out.latency_s > 0
    assert any(out.replies) and len(set(out.replies)) > 1  # replies that differ: the prompts reached the judge


def test_a_label_judge_without_its_label_in_the_reply_fails_every_sample(tiny_model: Path) -> None:
    judge = _judge(tiny_model, parser="label", labels={"verdict-never-written": 1.0}, scale=None)
    out = judge.score(QUESTIONS, RESPONSES, TRUTHS)
    assert out.failed.all() and out.parse_failures == 5 and out.errors == 0 and out.scores.sum() == 0


def test_a_prompt_too_long_fails_only_its_sample(tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    judge = _judge(tiny_model, max_model_len=64)
    assert judge.max_prompt_tokens == 64 - 6  # reward.judge.max_model_len minus max_tokens
    whole = judge.score(["q", "q"], ["1", "3"], ["1", "3"])
    with caplog.at_level(logging.WARNING):
        out = judge.score(["q", "x" * 300, "q"], ["1", "2", "3"], ["1", "2", "3"])
    assert out.failed[1] and out.replies[1] == "" and (out.errors, out.scores[1].item()) == (1, 0.0)
    assert [out.replies[0], out.replies[2]] == whole.replies  # the others were judged as without it
    assert f"more than its max_model_len minus max_tokens ({64 - 6})" in (out.first_error or "")
    assert "judge failed on 1 of 3 samples" in caplog.text


def test_an_exception_while_generating_fails_the_call_and_the_next_call_works(
    judge: LocalJudge, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert judge.engine is not None
    want = judge.score(QUESTIONS, RESPONSES, TRUTHS).replies
    with monkeypatch.context() as patch:  # a fault injected into the real engine's step
        patch.setattr(
            judge.engine, "step", lambda: (_ for _ in ()).throw(RuntimeError("CUDA out of memory (simulated)"))
        )
        out = judge.score(QUESTIONS, RESPONSES, TRUTHS)
    assert out.failed.all() and out.errors == 5 and out.replies == [""] * 5
    assert out.first_error == "RuntimeError: CUDA out of memory (simulated)"
    assert judge.score(QUESTIONS, RESPONSES, TRUTHS).replies == want  # nothing of the failed call stayed queued


def test_greedy_replies_do_not_depend_on_the_batch(judge: LocalJudge) -> None:
    whole = judge.score(QUESTIONS, RESPONSES, TRUTHS).replies
    single = [judge.score([q], [r], [t]).replies[0] for q, r, t in zip(QUESTIONS, RESPONSES, TRUTHS, strict=True)]
    assert whole == single


def test_sampling_is_seeded_per_call(tiny_model: Path) -> None:
    first = _judge(tiny_model, temperature=1.0, seed=7)
    a = [first.score(QUESTIONS, RESPONSES, TRUTHS).replies for _ in range(2)]
    again = _judge(tiny_model, temperature=1.0, seed=7).score(QUESTIONS, RESPONSES, TRUTHS).replies
    other = _judge(tiny_model, temperature=1.0, seed=8).score(QUESTIONS, RESPONSES, TRUTHS).replies
    assert again == a[0]  # the same seed: the same replies
    assert a[1] != a[0] and other != a[0]  # another call, or another seed: other samples


def test_prompts_with_and_without_a_chat_template(judge: LocalJudge, tiny_model: Path, tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A: 7"}]
    want = judge.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert judge.tokenizer.decode(judge.prompt_ids(messages)) == want
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


def test_fields_and_close(tiny_model: Path) -> None:
    with _judge(tiny_model, parser="label", labels={"yes": 1.0, "no": 0.0}, scale=None, max_tokens=4) as judge:
        assert (judge.parser, judge.labels, judge.scale, judge.max_tokens) == (
            "label",
            {"yes": 1.0, "no": 0.0},
            None,
            4,
        )
        assert judge.template.text == TEMPLATE and judge.max_prompt_tokens == 252
        assert type(judge.engine).__name__ == "HFEngine"
    assert judge.engine is None


@pytest.mark.parametrize("url", [None, "http://judge:8000/v1"])
def test_the_plan_gives_a_co_hosted_judge_an_engine_of_its_own(url: str | None) -> None:
    from torchrl_post.config.load import load_config

    cfg = load_config(["reward.judge.enable=true", "reward.judge.model=grader", "rollout.engine=hf"])
    cfg.reward.judge.url = url
    plan = plan_run(cfg, world_size=2, device="cuda")
    if url is not None:
        assert plan.judge_engine is None and "judge: by URL" in plan.describe("cuda", "nccl")
        return
    spec = plan.judge_engine
    assert spec is not None and (spec.max_model_len, spec.load_format, spec.sleep_level) == (0, "auto", 0)
    assert spec.gpu_memory_utilization == 0.2 and spec.dtype == plan.engine.dtype
    assert "judge: co-hosted on every rollout rank: a hf engine of its own" in plan.describe("cuda", "nccl")


def test_a_self_judge_follows_every_weight_load_of_the_policy(tiny_model: Path) -> None:
    """reward.judge.model=policy: the judge's engine (engines/build.py `Followed`) loads each sync the policy's
    engine loads, so it grades with the current weights; the policy's engine is unchanged by it."""
    from torchrl_post.config.schema import Config
    from torchrl_post.engines.build import Followed, build_engine
    from torchrl_post.plan import engine_spec, judge_engine_spec

    cfg = Config()
    cfg.model.path, cfg.rollout.engine = str(tiny_model), "hf"
    cfg.reward.judge = JudgeConfig(enable=True, model="policy", template=TEMPLATE, parser="number", max_tokens=6)
    policy = build_engine(cfg.model, cfg.rollout, engine_spec(cfg), torch.device("cpu"), 0, 0, [3])
    judge = local_judge(cfg.reward.judge, judge_engine_spec(cfg), cfg.rollout, torch.device("cpu"), 0, cfg.model)
    assert judge.engine is not None and judge.max_prompt_tokens == 256 - 6  # the policy's positions
    followed = Followed(policy, judge.engine)  # type: ignore[arg-type]
    before = judge.score(QUESTIONS, RESPONSES, TRUTHS).replies
    torch.manual_seed(3)
    new = [(n, p.detach() + 0.05 * torch.randn_like(p)) for n, p in policy.model.named_parameters()]
    followed.load_weights((n, t.clone()) for n, t in new)
    after = judge.score(QUESTIONS, RESPONSES, TRUTHS).replies
    assert after != before  # the judge grades with the new weights
    for engine in (policy, judge.engine):
        got = dict(engine.model.named_parameters())  # type: ignore[attr-defined]
        assert all(torch.equal(got[n], t) for n, t in new)
    assert followed.pad_id == policy.pad_id  # the rest is the policy engine's


def test_the_plan_and_the_preflight_know_a_self_judge(tiny_model: Path) -> None:
    from torchrl_post.config.load import load_config
    from torchrl_post.config.preflight import check_judge

    lora = ["model.lora_rank=8", "model.lora_alpha=16", "rollout.lora_sync=merged"]
    cfg = load_config([f"model.path={tiny_model}", "reward.judge.enable=true", "reward.judge.model=policy", *lora])
    check_judge(cfg)  # model.path, no directory named `policy`
    plan = plan_run(cfg, world_size=2)
    spec = plan.judge_engine
    assert plan.self_judge and spec is not None and spec.lora_sync == "merged" == plan.engine.lora_sync
    assert spec.load_format == plan.engine.load_format and spec.sleep_level == 0
    assert "judge: the policy itself (self-judging), current weights" in plan.describe("cpu", "gloo")
