"""Tests of torchrl_post/train.py: the planned world, the printed plan and one-line errors from the entrypoint."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from tests.conftest import run_cmd
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.validate import validate_batch
from torchrl_post.distributed.placement import plan_placement
from torchrl_post.train import describe_plan, planned_world

# --- one-line errors from the entrypoint --------------------------------------------------------------------


def _dry_run(*overrides: str) -> Any:
    return run_cmd([sys.executable, "-m", "torchrl_post.train", "trainer.dry_run=true", *overrides], timeout=120)


def _one_error_line(proc: Any, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr[-3000:]


def test_entrypoint_non_integer_rank_is_one_line() -> None:
    _one_error_line(_dry_run("trainer.world_size=3", "placement.rollout=[2,x]"), "rank 'x' is not an integer")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here")
def test_entrypoint_cuda_without_a_gpu() -> None:
    _one_error_line(_dry_run("trainer.device=cuda"), "no CUDA device is visible; use trainer.device=cpu or auto")


# --- the plan -----------------------------------------------------------------------------------------------


def test_planned_world() -> None:
    assert planned_world(None, 3, True) == 3
    assert planned_world(8, 1, False) == 8
    with pytest.raises(ConfigError, match="torchrun started 2"):
        planned_world(4, 2, True)


def test_describe_plan_shows_meshes_engines_and_sync_group() -> None:
    cfg = load_config(["rollout.tensor_parallel_size=2", "actor.fsdp.fsdp_size=2", "trainer.max_off_policy_steps=1"])
    cfg.placement.actor, cfg.placement.rollout = [0, 1, 2, 3], [4, 5, 6, 7]
    p = plan_placement(cfg.placement, 8)
    text = describe_plan(cfg, p, validate_batch(cfg, 4, 2), "cpu", "gloo")
    assert "actor mesh ('dp_replicate', 'dp_shard') = (2, 2) (HSDP)" in text
    assert "rollout engines (vllm, tensor_parallel_size=2): [[4, 5], [6, 7]]" in text
    assert "weight sync: broadcast over ranks [0, 4, 5, 6, 7]" in text
    assert "max_off_policy_steps=1" in text and "samples_per_actor_rank: 32" in text
