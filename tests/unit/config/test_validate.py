"""Tests of torchrl_post/config/validate.py: batch arithmetic, roles placed on demand and placement checks."""

from __future__ import annotations

import dataclasses

import pytest

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import validate_batch
from torchrl_post.plan import plan_run

# --- validate_batch -----------------------------------------------------------------------------------------


def _cfg(**data_and_actor) -> Config:
    cfg = Config()
    data = {k: v for k, v in data_and_actor.items() if hasattr(cfg.data, k)}
    actor = {k: v for k, v in data_and_actor.items() if hasattr(cfg.actor, k)}
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, **data), actor=dataclasses.replace(cfg.actor, **actor)
    )


def test_validate_batch_prompts_not_divisible_by_ranks():
    with pytest.raises(ConfigError) as info:
        validate_batch(_cfg(train_batch_size=15), actor_dp=2, rollout_dp=2)
    assert "data.train_batch_size" in str(info.value)
    assert "\n" not in str(info.value)


def test_validate_batch_prompts_not_divisible_by_rollout_ranks():
    with pytest.raises(ConfigError) as info:
        validate_batch(_cfg(train_batch_size=16), actor_dp=1, rollout_dp=3)
    assert "data.train_batch_size" in str(info.value)


def test_validate_batch_mini_batch_does_not_divide_batch():
    with pytest.raises(ConfigError) as info:
        validate_batch(_cfg(train_batch_size=16, ppo_mini_batch_size=5), actor_dp=1, rollout_dp=1)
    assert "actor.ppo_mini_batch_size" in str(info.value)
    assert "\n" not in str(info.value)


def test_validate_batch_mini_batch_samples_not_divisible_by_actor_ranks():
    # 2 prompts x 8 samples over 4 ranks is 4 samples each (verl splits a mini-batch so); 1 x 3 over 4 is not whole
    validate_batch(_cfg(train_batch_size=16, ppo_mini_batch_size=2), actor_dp=4, rollout_dp=4)
    cfg = _cfg(train_batch_size=16, ppo_mini_batch_size=1)
    cfg.rollout.n = 3
    with pytest.raises(ConfigError) as info:
        validate_batch(cfg, actor_dp=4, rollout_dp=4)
    assert "actor.ppo_mini_batch_size=1 x rollout.n=3 = 3 samples per optimizer step" in str(info.value)


# --- placement checks -----------------------------------------------------------------------------------------


def _placement_error(world: int, overrides: list[str]) -> str:
    cfg = load_config(overrides)
    with pytest.raises(ConfigError) as info:
        plan_run(cfg, world)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    ("world", "overrides", "needle"),
    [
        (3, ["placement.actor=[0,1]", "placement.rollout=[2]", "rollout.tensor_parallel_size=2"], "does not divide"),
        (3, ["placement.actor=[0,1]", "placement.rollout=[2]", "rollout.engine=hf"], "rollout.engine=hf"),
        (2, ["trainer.max_off_policy_steps=1"], "trainer.max_off_policy_steps=1 needs the rollout on ranks of its own"),
        (4, ["actor.fsdp.fsdp_size=3"], "actor.fsdp.fsdp_size=3"),
        (5, ["placement.actor=[0,1,2]", "placement.rollout=[3,4]", "data.train_batch_size=16"], "3 actor"),
        (4, ["placement.actor=[0,1]", "placement.rollout=[2,3]", "data.train_batch_size=3"], "train_batch_size=3"),
        (
            3,
            ["algorithm.adv_estimator=gae", "placement.actor=[0,1]", "placement.rollout=[2]", "placement.critic=[2]"],
            "placement.critic",
        ),
    ],
)
def test_placement_errors_name_the_key(world: int, overrides: list[str], needle: str) -> None:
    assert needle in _placement_error(world, overrides)


# --- algorithm.rollout_correction ---------------------------------------------------------------------------------

RC = "algorithm.rollout_correction"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{RC}.rollout_is=geometric"], f"{RC}.rollout_is='geometric' is not one of auto, token, sequence, null"),
        ([f"{RC}.rollout_is=none"], f"{RC}.rollout_is='none' is not one of auto, token, sequence, null"),
        ([f"{RC}.rollout_rs=seq_mean_k1"], f"{RC}.rollout_rs='seq_mean_k1' is not one of token, sequence, geometric"),
        ([f"{RC}.rollout_is_threshold=0"], f"{RC}.rollout_is_threshold=0.0 must be > 0"),
        ([f"{RC}.rollout_rs_threshold=-1"], f"{RC}.rollout_rs_threshold=-1.0 must be > 0"),
        ([f"{RC}.rollout_rs_threshold_lower=0"], f"{RC}.rollout_rs_threshold_lower=0.0 must be > 0"),
        ([f"{RC}.rollout_token_veto_threshold=0"], f"{RC}.rollout_token_veto_threshold=0.0 must be > 0"),
        (
            [f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=1.5", f"{RC}.rollout_rs_threshold_lower=2"],
            f"{RC}.rollout_rs_threshold_lower=2 is above {RC}.rollout_rs_threshold=1.5",
        ),
        (  # a null lower end is 1 / upper: above an upper end below 1
            [f"{RC}.rollout_rs=geometric", f"{RC}.rollout_rs_threshold=0.5"],
            f"{RC}.rollout_rs_threshold_lower=2 is above {RC}.rollout_rs_threshold=0.5",
        ),
        (  # a band that leaves out a ratio of 1 rejects every on-policy token
            [f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=2", f"{RC}.rollout_rs_threshold_lower=1.5"],
            f"{RC}.rollout_rs_threshold_lower=1.5: the kept band [1.5, 2] leaves out a ratio of 1",
        ),
        (
            [f"{RC}.rollout_rs=sequence", f"{RC}.rollout_rs_threshold=0.9", f"{RC}.rollout_rs_threshold_lower=0.5"],
            f"{RC}.rollout_rs_threshold=0.9: the kept band [0.5, 0.9] leaves out a ratio of 1",
        ),
        ([f"{RC}.rollout_token_veto_threshold=1"], f"{RC}.rollout_token_veto_threshold=1 vetoes a sample"),
        ([f"{RC}.rollout_token_veto_threshold=3"], f"{RC}.rollout_token_veto_threshold=3 vetoes a sample"),
    ],
)
def test_rollout_correction_errors_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    msg = str(info.value)
    assert msg.startswith(message) and "\n" not in msg, msg


def test_rollout_correction_values_accepted() -> None:
    cfg = load_config([f"{RC}.rollout_is=sequence", f"{RC}.rollout_rs=geometric", f"{RC}.rollout_rs_threshold=1.001"])
    rc = cfg.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_rs, rc.rollout_rs_threshold) == ("sequence", "geometric", 1.001)
    # an empty band is only an error when something rejects with it
    load_config([f"{RC}.rollout_rs_threshold=1.5", f"{RC}.rollout_rs_threshold_lower=2"])
    assert load_config([f"{RC}.rollout_is=null"]).algorithm.rollout_correction.rollout_is is None
    # bands around 1 and a small veto keep on-policy samples
    load_config([f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=2", f"{RC}.rollout_rs_threshold_lower=1"])
    load_config([f"{RC}.rollout_rs=geometric", f"{RC}.rollout_rs_threshold=1.001"])
    assert load_config([f"{RC}.rollout_token_veto_threshold=1e-4"]).algorithm.rollout_correction is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.truncation=both"], "data.truncation='both' is not one of error, left, right, middle"),
        (["algorithm.advantage_clip=0"], "algorithm.advantage_clip=0.0 must be > 0"),
        (["algorithm.advantage_clip=-1"], "algorithm.advantage_clip=-1.0 must be > 0"),
    ],
)
def test_truncation_and_advantage_keys_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert str(info.value) == message


def test_truncation_and_advantage_keys_accepted() -> None:
    cfg = load_config(["data.truncation=middle", "algorithm.whiten_advantages=true", "algorithm.advantage_clip=5"])
    assert (cfg.data.truncation, cfg.algorithm.whiten_advantages, cfg.algorithm.advantage_clip) == ("middle", True, 5)
    default = load_config([])
    assert (default.data.truncation, default.algorithm.whiten_advantages, default.algorithm.advantage_clip) == (
        "error",
        False,
        None,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor.clip_cov_ratio=0"],
            "actor.clip_cov_ratio=0.0 must be in (0, 1] (a fraction of the trained tokens, e.g. 0.0002)",
        ),
        (
            ["actor.kl_cov_ratio=1.5"],
            "actor.kl_cov_ratio=1.5 must be in (0, 1] (a fraction of the trained tokens, e.g. 0.0002)",
        ),
        (
            ["actor.clip_cov_lb=5", "actor.clip_cov_ub=1"],
            "actor.clip_cov_lb=5.0 must be below actor.clip_cov_ub=1.0 (the covariance window of clip_cov; "
            "verl's defaults are 1 and 5)",
        ),
        (["actor.ppo_kl_coef=-1"], "actor.ppo_kl_coef=-1.0 must be >= 0"),
    ],
)
def test_entropy_control_keys_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert str(info.value) == message


def test_entropy_control_keys_load_with_verls_names_and_defaults() -> None:
    a = load_config([]).actor
    assert (a.clip_cov_ratio, a.clip_cov_lb, a.clip_cov_ub, a.kl_cov_ratio, a.ppo_kl_coef) == (
        2e-4,
        1.0,
        5.0,
        2e-4,
        1.0,
    )
    v = "actor_rollout_ref.actor.policy_loss"
    cfg = load_config(
        [f"{v}.loss_mode=clip_cov", f"{v}.clip_cov_ratio=0.001", f"{v}.clip_cov_lb=0.5", f"{v}.clip_cov_ub=4"]
    ).actor
    assert (cfg.policy_loss, cfg.clip_cov_ratio, cfg.clip_cov_lb, cfg.clip_cov_ub) == ("clip_cov", 0.001, 0.5, 4.0)
    cfg = load_config([f"{v}.loss_mode=kl_cov", f"{v}.kl_cov_ratio=0.002", f"{v}.ppo_kl_coef=0.5"]).actor
    assert (cfg.policy_loss, cfg.kl_cov_ratio, cfg.ppo_kl_coef) == ("kl_cov", 0.002, 0.5)


@pytest.mark.parametrize(
    ("overrides", "part"),
    [
        (["reward.weights.critic=1.0"], "unknown config key 'reward.weights.critic'"),
        (["reward.weights.reward_model=1.0"], "reward.weights.reward_model is set but that source is off"),
        (["reward.weights.judge=1.0"], "reward.weights.judge is set but that source is off"),
        (
            ["reward.judge.enable=true", "reward.judge.model=m", "reward.judge.parser=label"],
            "reward.judge.parser=label needs reward.judge.labels",
        ),
        (["reward.weights.rule=0"], "reward.weights are all 0"),
        (["reward.combine=mean"], "reward.combine"),
        (
            ["reward_model.enable=true", "reward_model.model.path=/rm", "algorithm.rejection_sample.enable=true"],
            "algorithm.rejection_sample.enable=true drops uniform groups as they finish, before the reward model",
        ),
        (
            [
                "reward_model.enable=true",
                "reward_model.model.path=/rm",
                "reward.weights.reward_model=0.5",
                "reward.weights.rule=1",
                "algorithm.rejection_sample.enable=true",
            ],
            "set reward.weights.reward_model=0",
        ),
        (["reward_model.enable=true", "reward_model.max_length=0"], "reward_model.max_length=0 must be > 0"),
        (
            [
                "reward_model.enable=true",
                "reward_model.model.path=/rm",
                "agent.env=pkg.mod:Env",
                "agent.agent=pkg.mod:Agent",
                "algorithm.stepwise_advantage.enable=true",
            ],
            "a reward model or judge scores an agent's whole trajectory (its transcript)",
        ),
    ],
)
def test_reward_sources_refused_in_one_line(overrides: list[str], part: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    msg = str(info.value)
    assert "\n" not in msg and part in msg, msg


def test_rejection_sampling_takes_the_sources_scored_as_groups_finish() -> None:
    judge = ["reward.judge.enable=true", "reward.judge.url=http://judge:8000/v1", "reward.judge.model=m"]
    load_config([*judge, "algorithm.rejection_sample.enable=true"])
    load_config([*judge, "reward.weights.rule=1", "reward.weights.judge=1", "algorithm.rejection_sample.enable=true"])
    rm = ["reward_model.enable=true", "reward_model.model.path=/rm", "reward.weights.reward_model=0"]
    load_config([*rm, "reward.weights.rule=1", "algorithm.rejection_sample.enable=true"])  # scored, logged, not trained
    apart = ["placement.actor=[0]", "placement.rollout=[1]", "placement.reward_model=[2]"]
    trained = ["reward_model.enable=true", "reward_model.model.path=/rm", "algorithm.rejection_sample.enable=true"]
    load_config([*trained, *apart])  # the reward model scores each group as it finishes, on the rollout ranks' side
