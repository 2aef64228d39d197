"""Where a distributed test worker computes: CPU and gloo unless TORCHRL_POST_TEST_DEVICE=cuda asks for a GPU.

The CPU tests set nothing and get what they always got (`read_env("cpu")`, float32). The GPU acceptance check
(tests/gpu/checks.py, `sequence_parallel`) sets `cuda`: each rank computes on cuda:LOCAL_RANK, or on
cuda:(LOCAL_RANK mod the GPUs) where there are fewer GPUs than ranks (one GPU hosts both ranks), and its process
group is gloo all the same: NCCL cannot host two ranks on one GPU, and gloo's all_to_all_single, all_reduce,
all_gather and broadcast take CUDA tensors (through pinned host copies; slow, and the point is parity, not
speed). The package's own backend for CUDA stays NCCL (`torchrl_post.distributed.env.read_env`): this is test
code building its DistEnv itself. TF32 is off on CUDA, so float32 is float32.

TORCHRL_POST_TEST_DTYPES: the compute dtypes a worker runs, comma-separated (default `float32`; the workers say
what they do with `bfloat16`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import torch

from torchrl_post.distributed.env import DistEnv, read_env

DEVICE_VAR = "TORCHRL_POST_TEST_DEVICE"
DTYPES_VAR = "TORCHRL_POST_TEST_DTYPES"
DTYPES = ("float32", "bfloat16")


def worker_env() -> DistEnv:
    """This rank's DistEnv: torchrun's variables, on CPU with gloo by default; see the module's docstring."""
    env = read_env("cpu")
    want = os.environ.get(DEVICE_VAR, "cpu")
    if want == "cpu":
        return env
    if want != "cuda":
        raise ValueError(f"{DEVICE_VAR}={want!r}: cpu or cuda")
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise RuntimeError(f"{DEVICE_VAR}=cuda but no CUDA device is visible")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return dataclasses.replace(env, device=torch.device("cuda", env.local_rank % gpus), backend="gloo")


def worker_dtypes() -> list[str]:
    """The dtypes to run, in order."""
    dtypes = [d.strip() for d in os.environ.get(DTYPES_VAR, "float32").split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"{DTYPES_VAR}={os.environ.get(DTYPES_VAR)!r}: a comma-separated list of {DTYPES}")
    return dtypes


def key_prefix(dtype: str) -> str:
    """Report keys of a float32 run stay as the CPU tests read them; a bfloat16 run's get `bf16_` in front."""
    return "" if dtype == "float32" else "bf16_"


def write_reports(report: Any, out: str) -> None:
    """Every rank's `report`, gathered to rank 0 and written there to `out` as a JSON list in rank order; then the
    process ends (`end_process`)."""
    import torch.distributed as dist

    from torchrl_post.distributed.env import end_process

    reports: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(reports, f)
    end_process(0)
