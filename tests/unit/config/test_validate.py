"""Tests of torchrl_post/config/validate.py: batch arithmetic, roles placed on demand and placement checks."""

from __future__ import annotations

import dataclasses

import pytest

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import uses_rollout_is, validate_batch, validate_placement
from torchrl_post.distributed.placement import plan_placement
from torchrl_post.train import describe_plan

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


# --- resolve_roles ------------------------------------------------------------------------------------------


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


def test_lora_kl_uses_the_adapter_off_model_not_a_reference_role() -> None:
    from torchrl_post.config.validate import resolve_roles

    cfg = load_config(["model.lora_rank=8", "actor.use_kl_loss=true"])
    resolve_roles(cfg)
    assert cfg.placement.reference is None
    full = load_config(["actor.use_kl_loss=true"])
    resolve_roles(full)
    assert full.placement.reference == "actor"


# --- rollout importance sampling and rollout.mode -----------------------------------------------------------


def test_rollout_is_auto_follows_off_policy_steps() -> None:
    assert not uses_rollout_is(load_config([]))
    assert not uses_rollout_is(load_config(["rollout.mode=async"]))  # continuous batching, still on-policy
    assert uses_rollout_is(load_config(["trainer.max_off_policy_steps=1"]))
    assert uses_rollout_is(load_config(["algorithm.rollout_is=token"]))
    assert not uses_rollout_is(load_config(["trainer.max_off_policy_steps=1", "algorithm.rollout_is=none"]))


def test_rollout_mode_async_is_valid_colocated() -> None:
    """verl users set rollout.mode=async everywhere; it must not be an error with the hybrid engine."""
    cfg = load_config(["rollout.mode=async"])
    p = plan_placement(cfg.placement, 2)
    validate_placement(cfg, p.ranks, p.colocated)
    assert "rollout mode: async, trainer.max_off_policy_steps=0 (on-policy)" in describe_plan(
        cfg, p, validate_batch(cfg, 2, 2), "cpu", "gloo"
    )


# --- placement checks -----------------------------------------------------------------------------------------


def _placement_error(world: int, overrides: list[str]) -> str:
    cfg = load_config(overrides)
    with pytest.raises(ConfigError) as info:
        p = plan_placement(cfg.placement, world)
        validate_placement(cfg, p.ranks, p.colocated)
        validate_batch(cfg, len(p.ranks["actor"]), len(p.ranks["rollout"]) // cfg.rollout.tensor_parallel_size)
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
        (3, ["placement.actor=[0,1]", "placement.rollout=[2]", "placement.critic=[2]"], "placement.critic"),
    ],
)
def test_placement_errors_name_the_key(world: int, overrides: list[str], needle: str) -> None:
    assert needle in _placement_error(world, overrides)
