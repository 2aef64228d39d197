"""Tests of torchrl_post/distributed/env.py: the device checks, one line each."""

from __future__ import annotations

import pytest
import torch

from tests.unit.error_helpers import _one_line
from torchrl_post.config.errors import ConfigError
from torchrl_post.distributed.env import read_env

# --- the device ---------------------------------------------------------------------------------------------


def test_cuda_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        read_env("cuda")
    msg = _one_line(info)
    assert "trainer.device=cuda" in msg and "no CUDA device is visible" in msg and "trainer.device=cpu" in msg
    assert read_env("auto").device.type == "cpu"
    # A dry run loads nothing: it plans for cuda without one.
    env = read_env("cuda", need_device=False)
    assert env.device.type == "cuda" and env.backend == "cpu:gloo,cuda:nccl"


def test_more_local_ranks_than_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as info:
        read_env("cuda")
    assert "LOCAL_RANK=1 but only 1 CUDA device(s) are visible" in _one_line(info)
