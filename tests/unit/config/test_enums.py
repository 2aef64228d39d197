"""Tests of torchrl_post/config/enums.py: the schema's enum keys are checked against their Literal types, and the
code that dispatches on a key handles exactly its type's values."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, get_args

import pytest
import torch

from torchrl_post.algos.advantages import group_advantages
from torchrl_post.algos.estimators import compute_advantages
from torchrl_post.algos.kl import kl_penalty
from torchrl_post.algos.lr_schedule import lr_factor
from torchrl_post.algos.policy_loss import agg_loss, policy_loss
from torchrl_post.algos.rollout_correction import RolloutCorrection, correct
from torchrl_post.config import enums
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import ActorConfig, AlgorithmConfig, Config
from torchrl_post.config.validate import enum_fields, validate


def _enum_keys(node: Any = Config, prefix: str = "") -> dict[str, tuple[str | None, ...]]:
    """Every enum key of the schema (dotted) -> the values it takes."""
    out = {f"{prefix}{name}": values for name, values in enum_fields(node).items()}
    for f in dataclasses.fields(node):
        child = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(child):
            out |= _enum_keys(type(child), f"{prefix}{f.name}.")
    return out


def _with(cfg: Config, key: str, value: Any) -> Config:
    cfg = copy.deepcopy(cfg)
    *path, name = key.split(".")
    node: Any = cfg
    for part in path:
        node = getattr(node, part)
    setattr(node, name, value)
    return cfg


def test_every_enum_key_is_checked_with_one_line_naming_its_values() -> None:
    keys = _enum_keys()
    assert {"rollout.engine", "trainer.logger", "algorithm.rollout_correction.rollout_rs"} <= set(keys)
    assert len(keys) == 36  # critic.fsdp.*_dtype among them, checked as the actor's
    for key, values in keys.items():
        names = ", ".join("null" if v is None else v for v in values)
        bad = ["tensorbored"] if key == "trainer.logger" else "tensorbored"
        with pytest.raises(ConfigError) as info:
            validate(_with(Config(), key, bad))
        assert str(info.value) == f"{key}='tensorbored' is not one of {names}"


def test_optional_enum_keys_take_null_and_their_values_load() -> None:
    keys = _enum_keys()
    assert keys["algorithm.rollout_correction.rollout_rs"] == ("token", "sequence", "geometric", None)
    assert keys["algorithm.rollout_correction.rollout_is"] == ("auto", "token", "sequence", None)
    assert keys["rollout.dtype"] == ("auto", "float32", "bfloat16", "float16")  # a nested Literal, flattened
    cfg = load_config(["rollout.engine=hf", "trainer.logger=[console,tensorboard]", "actor.fsdp.param_dtype=float16"])
    assert (cfg.rollout.engine, cfg.trainer.logger, cfg.actor.fsdp.param_dtype) == (
        "hf",
        ["console", "tensorboard"],
        "float16",
    )


def _handled(call: Any, values: tuple[str, ...]) -> None:
    """`call` runs for each of `values` and refuses any other name with a ValueError."""
    for value in values:
        call(value)
    with pytest.raises(ValueError):
        call("no_such_name")


def test_dispatchers_cover_exactly_their_literal() -> None:
    mask_bt = torch.ones(4, 3)
    scores_b, groups_b = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    logp_bt, ref_bt = torch.full((4, 3), -1.0), torch.full((4, 3), -1.2)

    def advantages(est: str) -> None:
        cfg = dataclasses.replace(AlgorithmConfig(), adv_estimator=est)
        compute_advantages(cfg, scores_b, mask_bt * 0.5, mask_bt, groups_b, values_bt=mask_bt * 0.1)

    _handled(advantages, get_args(enums.AdvEstimator))
    _handled(lambda est: group_advantages(scores_b, groups_b, est), get_args(enums.GroupEstimator))
    assert set(get_args(enums.GroupEstimator)) <= set(get_args(enums.AdvEstimator))
    _handled(lambda kind: kl_penalty(logp_bt, ref_bt, kind), get_args(enums.KLKind))
    _handled(lambda mode: agg_loss(logp_bt, mask_bt, mode), get_args(enums.LossAggMode))
    _handled(
        lambda mode: policy_loss(ActorConfig(policy_loss=mode), logp_bt, ref_bt, mask_bt * 0.5, mask_bt),
        get_args(enums.PolicyLoss),
    )
    _handled(lambda style: lr_factor(3, 1, 10, style), get_args(enums.LrSchedulerType))
    _handled(
        lambda level: correct(logp_bt, ref_bt, mask_bt, RolloutCorrection(rollout_rs=level)), get_args(enums.RSLevel)
    )
    _handled(
        lambda level: correct(logp_bt, ref_bt, mask_bt, RolloutCorrection(rollout_is=level)), get_args(enums.ISLevel)
    )
