"""Tests of torchrl_post/train.py: the planned world, the printed plan and one-line errors from the entrypoint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_cmd

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
    # A real run needs the GPU (a dry run plans for one: test_dry_run_memory_plan_for_7b_on_eight_cards).
    proc = run_cmd([sys.executable, "-m", "torchrl_post.train", "trainer.device=cuda"], timeout=120)
    _one_error_line(proc, "no CUDA device is visible; use trainer.device=cpu or auto")


def test_dry_run_memory_plan_for_7b_on_eight_cards(tmp_path: Path) -> None:
    """The acceptance: a Qwen2.5-7B-shaped config (config.json only: no weights, no tokenizer) on 8 x 80 GiB prints
    its memory plan; the same on 8 GiB cards stops with one line naming the keys to change."""
    from tests.unit.test_memory_plan import QWEN25_7B, SEVEN_B_RUN, write_config

    model = write_config(tmp_path / "qwen25_7b", QWEN25_7B)
    args = ["trainer.device=cuda", "trainer.world_size=8", f"model.path={model}", *SEVEN_B_RUN]
    proc = _dry_run(*args, "trainer.gpu_memory_gb=80")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "memory plan (cuda, 80.00 GiB per card" in proc.stdout, proc.stdout
    assert "ranks 0-7: actor + rollout" in proc.stdout and "peak by phase: generation" in proc.stdout
    _one_error_line(_dry_run(*args, "trainer.gpu_memory_gb=8"), "change one of: actor.fsdp.param_offload=true")
