"""Config composition, one-line errors, batch arithmetic and role placement (no process group)."""

import dataclasses

import pytest

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import Config, PlacementConfig
from torchrl_post.config.validate import validate_batch
from torchrl_post.distributed.placement import plan_placement


def _config_error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    msg = str(info.value)
    assert "\n" not in msg, f"ConfigError must be one line: {msg!r}"
    assert msg.strip(), "ConfigError must have a message"
    return msg


# --- load_config --------------------------------------------------------------------------------------------


def test_no_overrides_gives_demo_defaults():
    cfg = load_config([])
    assert isinstance(cfg, Config)
    assert cfg.model.path == "outputs/demo_model"
    assert cfg.data.train_files == "outputs/demo_data/train.jsonl"
    assert cfg.data.val_files == "outputs/demo_data/val.jsonl"
    assert cfg.data.train_batch_size == 16
    assert cfg.data.max_prompt_length == 64
    assert cfg.data.max_response_length == 8
    assert cfg.rollout.engine == "vllm"
    assert cfg.rollout.n == 8
    assert cfg.actor.lr == pytest.approx(5e-4)
    assert cfg.actor.betas == [0.9, 0.999]
    assert cfg.actor.loss_agg_mode == "token-mean"
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.reward.function is None
    assert cfg.placement.actor is None
    assert cfg.placement.rollout == "actor"
    assert cfg.trainer.total_training_steps == 300
    assert cfg.trainer.resume_mode == "auto"
    assert cfg.trainer.logger == ["console"]


def test_overrides_apply():
    cfg = load_config(["actor.lr=0.5", "data.train_files=[a.jsonl,b.jsonl]", "data.val_files=null", "rollout.n=4"])
    assert cfg.actor.lr == 0.5
    assert cfg.data.train_files == ["a.jsonl", "b.jsonl"]
    assert isinstance(cfg.data.train_files, list)
    assert cfg.data.val_files is None
    assert cfg.rollout.n == 4
    # Untouched keys keep their defaults.
    assert cfg.data.train_batch_size == 16


def test_overrides_do_not_leak_between_calls():
    assert load_config(["actor.lr=0.25"]).actor.lr == 0.25
    assert load_config([]).actor.lr == pytest.approx(5e-4)


def test_unknown_key_in_section():
    msg = _config_error(["data.foo=1"])
    assert "data.foo" in msg


def test_unknown_top_level_key():
    msg = _config_error(["foo=1"])
    assert "'foo'" in msg


def test_appended_unknown_key_is_rejected():
    msg = _config_error(["+data.foo=1"])
    assert "data.foo" in msg


def test_wrong_type():
    msg = _config_error(["actor.lr=abc"])
    assert "actor.lr" in msg


def test_bad_enum():
    msg = _config_error(["rollout.engine=x"])
    assert "rollout.engine" in msg


def test_grpo_needs_group_of_two():
    msg = _config_error(["rollout.n=1"])
    assert "rollout.n" in msg
    # n=2 is the smallest valid group.
    assert load_config(["rollout.n=2"]).rollout.n == 2


def test_resume_path_needs_a_path():
    msg = _config_error(["trainer.resume_mode=resume_path"])
    assert "trainer.resume_from_path" in msg
    cfg = load_config(["trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_3"])
    assert cfg.trainer.resume_from_path == "ckpt/global_step_3"


def test_reward_function_needs_colon():
    msg = _config_error(["reward.function=nocolon"])
    assert "reward.function" in msg
    assert load_config(["reward.function=pkg.mod:fn"]).reward.function == "pkg.mod:fn"


@pytest.mark.parametrize("override", ["actor.lr", "+actor.lr=0.5"])
def test_hydra_override_errors_are_one_line(override):
    # Hydra's own multi-line reports (bad override grammar, appending an existing key) are joined into one line.
    msg = _config_error([override])
    assert "actor.lr" in msg


def test_empty_train_files():
    msg = _config_error(["data.train_files="])
    assert "data.train_files" in msg


# --- validate_batch -----------------------------------------------------------------------------------------


def _cfg(**data_and_actor) -> Config:
    cfg = Config()
    data = {k: v for k, v in data_and_actor.items() if hasattr(cfg.data, k)}
    actor = {k: v for k, v in data_and_actor.items() if hasattr(cfg.actor, k)}
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, **data), actor=dataclasses.replace(cfg.actor, **actor)
    )


def test_validate_batch_per_rank_numbers():
    cfg = _cfg(train_batch_size=16)
    assert cfg.rollout.n == 8
    out = validate_batch(cfg, actor_dp=2, rollout_dp=2)
    assert out == {
        "prompts_per_step": 16,
        "samples_per_step": 128,
        "prompts_per_rollout_engine": 8,
        "samples_per_actor_rank": 64,
        "mini_batches_per_epoch": 1,
        "samples_per_mini_batch_per_rank": 64,
        "micro_batch_per_rank": 32,
    }


def test_validate_batch_with_mini_batches_and_separate_rollout_ranks():
    cfg = _cfg(train_batch_size=16, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=64)
    out = validate_batch(cfg, actor_dp=2, rollout_dp=4)
    assert out["prompts_per_rollout_engine"] == 4  # 16 / 4
    assert out["samples_per_actor_rank"] == 64  # 16 * 8 / 2
    assert out["mini_batches_per_epoch"] == 4  # 16 / 4
    assert out["samples_per_mini_batch_per_rank"] == 16  # 4 * 8 / 2
    assert out["micro_batch_per_rank"] == 16  # min(64, 16)


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


def test_validate_batch_mini_batch_not_divisible_by_actor_ranks():
    with pytest.raises(ConfigError) as info:
        validate_batch(_cfg(train_batch_size=16, ppo_mini_batch_size=2), actor_dp=4, rollout_dp=4)
    assert "actor.ppo_mini_batch_size" in str(info.value)


# --- plan_placement -----------------------------------------------------------------------------------------


def _placement_error(world_size: int, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        plan_placement(PlacementConfig(**kw), world_size)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_default_placement_is_colocated_on_all_ranks():
    p = plan_placement(PlacementConfig(), 2)
    assert p.world_size == 2
    assert p.ranks == {"actor": [0, 1], "rollout": [0, 1]}
    assert p.colocated == {"actor": True, "rollout": True}
    assert p.fully_colocated()
    assert not p.has("critic") and not p.has("reference")


def test_disaggregated_placement():
    p = plan_placement(PlacementConfig(actor=[1, 0], rollout=[3, 2]), 4)
    assert p.ranks == {"actor": [0, 1], "rollout": [2, 3]}
    assert p.colocated["rollout"] is False
    assert not p.fully_colocated()


def test_placement_rank_out_of_range():
    msg = _placement_error(2, actor=[0, 2])
    assert "placement.actor" in msg


def test_placement_duplicate_rank():
    msg = _placement_error(2, actor=[0, 0, 1])
    assert "placement.actor" in msg


def test_placement_partial_overlap_with_actor():
    msg = _placement_error(3, actor=[0, 1], rollout=[1, 2])
    assert "placement.rollout" in msg


def test_placement_ranks_without_role():
    msg = _placement_error(4, actor=[0, 1], rollout="actor")
    assert "[2, 3]" in msg


def test_placement_rollout_null():
    msg = _placement_error(2, rollout=None)
    assert "placement.rollout" in msg


def test_roles_placed_on_demand_and_dropped_when_unused() -> None:
    from torchrl_post.config.validate import resolve_roles

    cfg = load_config(["algorithm.adv_estimator=gae", "actor.use_kl_loss=true"])
    notes = resolve_roles(cfg)
    assert cfg.placement.critic == "actor" and cfg.placement.reference == "actor"
    assert len(notes) == 2 and "algorithm.adv_estimator=gae" in notes[0]
    cfg = load_config(["placement.critic=actor", "placement.reference=[0]"])
    notes = resolve_roles(cfg)
    assert cfg.placement.critic is None and cfg.placement.reference is None
    assert all("ignored" in n for n in notes)
    assert resolve_roles(load_config([])) == []


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator"),
        ("actor.kl_loss_type=k9", "actor.kl_loss_type"),
        ("algorithm.kl_penalty=big", "algorithm.kl_penalty"),
        ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type"),
        ("actor.clip_ratio_c=0.5", "actor.clip_ratio_c"),
        ("actor.policy_loss=dpo", "actor.policy_loss"),
        ("algorithm.lam=1.5", "algorithm.lam"),
        ("critic.loss_agg_mode=sum", "critic.loss_agg_mode"),
    ],
)
def test_algorithm_keys_validated(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert key in str(err.value) and "\n" not in str(err.value)


AGENT = ["agent.env=torchrl_post.agent.math_agent:MathEnv", "agent.agent=torchrl_post.agent.math_agent:ToolAgent"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.stepwise_advantage.enable=true"], "algorithm.stepwise_advantage.enable=true trains agent steps"),
        ([*AGENT, "algorithm.stepwise_advantage.mode=per_turn"], "algorithm.stepwise_advantage.mode"),
        (
            [*AGENT, "algorithm.stepwise_advantage.enable=true", "algorithm.adv_estimator=gae"],
            "adv_estimator in grpo, rloo",
        ),
        ([*AGENT, "agent.env_workers=-1"], "agent.env_workers"),
    ],
)
def test_agent_and_stepwise_keys_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides)


def test_agent_runs_on_tensor_parallel_and_hf_engines() -> None:
    """The lockstep loop and the hf engine's per-turn batches: no longer refused."""
    cfg = load_config([*AGENT, "rollout.tensor_parallel_size=2", "agent.tools=[calculator]"])
    assert cfg.agent.tools == ["calculator"]
    assert load_config([*AGENT, "rollout.engine=hf"]).rollout.engine == "hf"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.lora_rank=-1"], "model.lora_rank"),
        (["model.lora_rank=8", "model.lora_dropout=1.0"], "model.lora_dropout"),
        (["rollout.limit_images=0"], "rollout.limit_images"),
        (["data.image_key="], "data.image_key"),
        (["model.lora_rank=8", "model.target_modules=[]"], "model.target_modules"),
    ],
)
def test_lora_and_vlm_keys_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides)


def test_lora_kl_uses_the_adapter_off_model_not_a_reference_role() -> None:
    from torchrl_post.config.validate import resolve_roles

    cfg = load_config(["model.lora_rank=8", "actor.use_kl_loss=true"])
    resolve_roles(cfg)
    assert cfg.placement.reference is None
    full = load_config(["actor.use_kl_loss=true"])
    resolve_roles(full)
    assert full.placement.reference == "actor"
