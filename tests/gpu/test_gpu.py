"""The GPU acceptance list, one test per check (tests/gpu/driver.py's CHECKS, docs/gpu.md): each runs its function
of tests/gpu/checks.py in a process of its own under its time limit. Skipped without a CUDA device, without its
package or with too few GPUs; failed when the check fails, overruns its limit, or the budget no longer allows it.

    make gpu-check                                 # = python -m pytest tests/gpu --gpu-check -v
    make gpu-check ARGS="-k packed_rows"
    python -m pytest tests/gpu -k cuda_nccl --gpu-device cpu       # the plumbing, on CPU
"""

from __future__ import annotations

import pytest

from tests.gpu.driver import CHECKS, Check, Runner


@pytest.mark.gpu
@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_gpu(check: Check, gpu_runner: Runner) -> None:
    rec = gpu_runner.run(check)
    if rec.status == "skipped":
        pytest.skip(rec.reason)
    if rec.status != "passed":
        pytest.fail(f"{check.name}: {rec.reason}", pytrace=False)
