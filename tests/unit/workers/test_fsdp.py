"""Tests of torchrl_post/workers/fsdp.py: every role's model loads in model.dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchrl_post.config.schema import ModelConfig
from torchrl_post.workers.models import load_causal_lm


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_policy_loads_in_model_dtype(tiny_model: Path, dtype: str) -> None:
    for trainable in (True, False):  # the actor and the reference
        model = load_causal_lm(ModelConfig(path=str(tiny_model), dtype=dtype), trainable=trainable)
        assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
