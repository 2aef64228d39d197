"""The torchrun environment -> one process group, and the single place that picks device and backend.

Nothing else in the package reads RANK/WORLD_SIZE or chooses between cpu/gloo and cuda/nccl.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device_type(preference: str) -> str:
    """`auto` -> cuda when an accelerator is present, else cpu."""
    if preference == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but no CUDA device is visible; use trainer.device=auto or cpu")
    return preference


def read_env(device_preference: str = "auto") -> DistEnv:
    """Read torchrun's variables (a plain `python -m` run is a world of one)."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device_type = resolve_device_type(device_preference)
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        # nccl for tensors on the GPU, gloo for the CPU-side objects (sampler state, metrics).
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    return DistEnv(rank, world, local_rank, local_world, device, backend)


def init_distributed(env: DistEnv, timeout_s: int = 1800) -> None:
    """Create the default process group (also for a world of one, so every code path is the same)."""
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ:  # plain python, not torchrun
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    timeout = timedelta(seconds=timeout_s)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # After a restart (torchrun --max-restarts), the ranks must not read addresses the dead ranks left in the
        # agent's store: gloo would connect to them and hang. Keys live under a prefix per attempt.
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), env.world_size, is_master=False, timeout=timeout
        )
        dist.init_process_group(
            backend=env.backend,
            store=dist.PrefixStore(f"torchrl_post/attempt_{attempt}", store),
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
        )
        return
    dist.init_process_group(backend=env.backend, timeout=timeout)


def shutdown_distributed() -> None:
    # vLLM's engine teardown may already have destroyed the default group.
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
