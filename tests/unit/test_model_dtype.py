"""model.dtype: validated as one ConfigError line, and the dtype every role's model is loaded in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import ModelConfig
from torchrl_post.workers.fsdp import load_causal_lm


def test_model_dtype_default_and_override() -> None:
    assert load_config([]).model.dtype == "float32"
    assert load_config(["model.dtype=bfloat16"]).model.dtype == "bfloat16"


@pytest.mark.parametrize("value", ["float64", "bf16", "int8"])
def test_invalid_model_dtype_is_one_config_error(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([f"model.dtype={value}"])
    msg = str(info.value)
    assert "\n" not in msg
    assert msg == f"model.dtype='{value}' is not one of float32, bfloat16, float16"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_policy_loads_in_model_dtype(tiny_model: Path, dtype: str) -> None:
    for trainable in (True, False):  # the actor and the reference
        model = load_causal_lm(ModelConfig(path=str(tiny_model), dtype=dtype), trainable=trainable)
        assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
