"""Tests of torchrl_post/train.py: the planned world, the printed plan and one-line errors from the entrypoint."""

from __future__ import annotations

import sys
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
    _one_error_line(_dry_run("trainer.device=cuda"), "no CUDA device is visible; use trainer.device=cpu or auto")
