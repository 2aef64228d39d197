"""SFT and distillation settings: the plan they make, and bad input as one line naming the key, before any model
loads (config/validate.py, config/preflight.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.error_helpers import _one_line
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.preflight import check_teacher
from torchrl_post.demo.build import build_tiny_model
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.plan import plan_run


def test_the_sft_plan_has_no_engine_no_old_logprobs_and_one_sample_per_row() -> None:
    cfg = load_config(["sft.enable=true", "data.train_batch_size=8", "actor.ppo_epochs=2", "rollout.n=4"])
    plan = plan_run(cfg, 2)
    assert plan.sft and plan.group_size == 1 and not plan.needs_old_log_probs and not plan.skip_zero_advantage
    assert plan.roles["actor"].mini_batch_samples == 4  # 8 rows over 2 ranks, not 8 x rollout.n
    text = plan.describe("cpu", "gloo")
    assert "no engine, no weight sync" in text and "rollout engines" not in text and "weight sync:" not in text


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["sft.enable=true", "reward_model.enable=true", "reward_model.model.path=/m"], "drop reward_model.enable"),
        (["sft.enable=true", "actor.use_kl_loss=true"], "drop actor.use_kl_loss=true"),
        (["sft.enable=true", "distillation.enable=true", "distillation.teacher.path=/t"], "distillation.enable"),
        (["distillation.enable=true"], "needs distillation.teacher.path="),
        (["distillation.enable=true", "distillation.teacher.path=/t", "distillation.loss_mode=k1",
          "distillation.use_policy_gradient=false"], "no gradient toward the teacher"),
        (["distillation.enable=true", "distillation.teacher.path=/t", "distillation.distillation_loss_coef=-1"],
         "distillation.distillation_loss_coef"),
        (["distillation.enable=true", "distillation.teacher.path=/t", "distillation.loss_mode=forward_kl_topk",
          "distillation.topk=0"], "distillation.topk"),
        (["sft.enable=true", "sft.truncation=left"], "sft.truncation"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_line_naming_the_key(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    assert says in _one_line(e)


def test_verls_sft_and_distillation_keys_load_and_its_estimator_default_places_no_critic_under_sft() -> None:
    cfg = load_config(["sft.enable=true", "data.response_key=answer", "data.multiturn.messages_key=chat"])
    assert (cfg.sft.response_key, cfg.sft.messages_key) == ("answer", "chat")
    assert cfg.algorithm.adv_estimator == "gae"  # verl's default, taken with verl's keys: not read by SFT
    assert plan_run(cfg, 2).critic == "none"
    d = load_config(
        ["distillation.enabled=true", "distillation.teacher.path=/t", "distillation.distillation_loss.loss_mode=k1",
         "distillation.distillation_loss.distillation_loss_coef=0.5"]
    ).distillation  # fmt: skip
    assert (d.enable, d.loss_mode, d.distillation_loss_coef) == (True, "k1", 0.5)
    with pytest.raises(ConfigError) as e:
        load_config(["distillation.teacher_models.gsm8k.model_path=/t"])
    assert "distillation.teacher.path" in _one_line(e)


def test_the_teacher_is_placed_with_the_actor_or_on_ranks_of_its_own() -> None:
    base = ["distillation.enable=true", "distillation.teacher.path=/t", "data.train_batch_size=4"]
    plan = plan_run(load_config(base), 2)
    assert plan.teacher == "colocated" and plan.roles["teacher"].ranks == (0, 1)
    assert any("placement.teacher: colocated" in n for n in plan.notes)
    own = plan_run(load_config([*base, "placement.actor=[0,1]", "placement.teacher=[2]"]), 3)
    assert own.teacher == "own_ranks" and own.roles["teacher"].ranks == (2,)
    assert "distillation teacher: own_ranks" in own.describe("cpu", "gloo")
    assert not own.skip_zero_advantage  # the distillation term reads rows whose task advantage is 0
    # what the teacher answers: its logprob of each sampled token, or (forward_kl_topk) its top-k at each position
    assert (own.teacher_top_k, own.teacher_field) == (0, "teacher_log_probs")
    topk = plan_run(load_config([*base, "distillation.loss_mode=forward_kl_topk", "distillation.topk=16"]), 2)
    assert (topk.teacher_top_k, topk.teacher_field) == (16, "teacher_topk")
    assert "(its top-16 tokens per position)" in topk.describe("cpu", "gloo")


def test_a_teacher_with_another_tokenizer_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    build_tiny_model(tmp_path / "t", hidden_size=64, num_heads=2, num_kv_heads=1, extra_special=["<think>"])
    build_tiny_model(tmp_path / "same", hidden_size=32, num_heads=1, num_kv_heads=1)
    cfg = load_config(["distillation.enable=true", f"distillation.teacher.path={tmp_path / 't'}"])
    with pytest.raises(ConfigError) as e:
        check_teacher(cfg, build_char_tokenizer(128))
    assert "another tokenizer than model.path" in _one_line(e) and "distillation.teacher.path" in _one_line(e)
    ok = load_config(["distillation.enable=true", f"distillation.teacher.path={tmp_path / 'same'}"])
    check_teacher(ok, build_char_tokenizer(128))  # another size, the same tokenizer
    wide = load_config(
        ["distillation.enable=true", f"distillation.teacher.path={tmp_path / 'same'}",
         "distillation.loss_mode=forward_kl_topk", "distillation.topk=129"]
    )  # fmt: skip
    with pytest.raises(ConfigError) as e:
        check_teacher(wide, build_char_tokenizer(128))
    assert "distillation.topk=129 is more than the teacher's vocabulary (128 tokens)" in _one_line(e)
