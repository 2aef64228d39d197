"""The torchrun environment -> one process group, and the single place that picks device and backend.

Nothing else in the package reads RANK/WORLD_SIZE or chooses between cpu/gloo and cuda/nccl.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from torchrl_post.config.errors import ConfigError

# A c10d backend object (ProcessGroupGloo / ProcessGroupNCCL) used directly: `.broadcast([t], opts)`, `.send`,
# `.recv`, `.allgather`, `.barrier`. torch's stubs do not declare those methods on Backend, hence Any.
RawGroup = Any


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


def resolve_device_type(preference: str, need_device: bool = True) -> str:
    """`auto` -> cuda when an accelerator is present, else cpu. `need_device=False` (a dry run, which loads
    nothing) takes cuda at its word without a visible GPU."""
    if preference == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "cuda" and need_device and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is visible; use trainer.device=cpu or auto")
    return preference


LAUNCH_RANK_VAR = "TORCHRL_POST_LAUNCH_RANK"
"""torchrun's RANK, kept here when a cell's process group rewrites RANK to the rank within the cell."""


def launch_rank() -> int:
    """torchrun's global rank, as launched, whenever it is read (a cell rewrites RANK; its launch value is kept in
    `LAUNCH_RANK_VAR`). 0 outside torchrun."""
    return int(os.environ.get(LAUNCH_RANK_VAR, os.environ.get("RANK", "0")))


def under_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ


def read_env(device_preference: str = "auto", need_device: bool = True) -> DistEnv:
    """Read torchrun's variables (a plain `python -m` run is a world of one); `need_device` as
    `resolve_device_type`."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device_type = resolve_device_type(device_preference, need_device)
    if device_type == "cuda":
        visible = torch.cuda.device_count()
        if need_device and local_rank >= visible:
            raise ConfigError(
                f"trainer.device=cuda: LOCAL_RANK={local_rank} but only {visible} CUDA device(s) are visible; "
                f"start at most {visible} processes per node (--nproc-per-node) or check CUDA_VISIBLE_DEVICES"
            )
        device = torch.device("cuda", local_rank)
        # nccl for tensors on the GPU, gloo for the CPU-side objects (sampler state, metrics).
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    return DistEnv(rank, world, local_rank, local_world, device, backend)


def open_store(env: DistEnv, timeout_s: float = 1800, client: bool = False) -> dist.Store:
    """A client of torchrun's rendezvous store, under a prefix per restart attempt.

    After a restart (torchrun --max-restarts) the ranks must not read addresses the dead ranks left in the
    agent's store: gloo would connect to them and hang. So every key lives under `attempt_<n>/`. `client`: a
    further connection (a thread's own), never the server that rank 0 hosts outside torchrun's agent store.
    """
    if "MASTER_ADDR" not in os.environ:  # plain python, not torchrun
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    timeout = timedelta(seconds=timeout_s)
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        env.world_size,
        is_master=not agent and env.rank == 0 and not client,
        timeout=timeout,
        wait_for_workers=False,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"torchrl_post/attempt_{attempt}", store)


def init_distributed(env: DistEnv, store: dist.Store, cell: list[int], name: str, timeout_s: int = 1800) -> None:
    """Make `cell` (global ranks sharing one set of roles) this rank's default process group.

    Fully colocated, the cell is the whole world. With roles on their own ranks each cell is its own torch
    world: vLLM's `external_launcher` builds its groups with collectives over the default world, so a rollout
    cell must be a world of its own; cross-role traffic goes over the explicit groups of `new_group`.
    """
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if dist.is_initialized():
        return
    dist.init_process_group(
        backend=env.backend,
        store=dist.PrefixStore(f"cell_{name}", store),
        rank=cell.index(env.rank),
        world_size=len(cell),
        timeout=timedelta(seconds=timeout_s),
    )
    # vLLM (external_launcher) reads the torchrun variables; inside a cell they are the cell's.
    os.environ.setdefault(LAUNCH_RANK_VAR, os.environ.get("RANK", "0"))
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(cell.index(env.rank)), str(len(cell))


def init_world(env: DistEnv) -> dist.Store:
    """One cell of every rank (the colocated layout); returns the store for further groups."""
    store = open_store(env)
    init_distributed(env, store, list(range(env.world_size)), "all")
    return store


def new_group(
    env: DistEnv, store: dist.Store, name: str, members: list[int], device_side: bool, timeout_s: int = 1800
) -> RawGroup | None:
    """A process group over `members` (global ranks) outside torch's registry; None on non-members.

    `device_side` picks the accelerator backend (nccl) for tensors on the device, else gloo (CPU objects).
    Only the members call this, so cells can build groups among themselves without the others.
    """
    if env.rank not in members:
        return None
    prefixed = dist.PrefixStore(f"group_{name}", store)
    rank, size, timeout = members.index(env.rank), len(members), timedelta(seconds=timeout_s)
    if device_side and env.device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, opts)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


def shutdown_distributed() -> None:
    # vLLM's engine teardown may already have destroyed the default group.
    if dist.is_initialized():
        dist.destroy_process_group()


def end_process(code: int = 0) -> NoReturn:
    """End a rank whose work is done and written (files, checkpoints and loggers closed) without interpreter
    finalization. Modules keep their gloo groups alive past destroy_process_group, and a gloo worker thread that
    drops the last reference to a finished collective's tensors needs the GIL: during finalization that thread
    is killed inside a destructor and the rank aborts (SIGABRT, "terminate called without an active exception")
    after work that succeeded - about one exit in four measured on 2 CPU cores (torch issue 190489)."""
    shutdown_distributed()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
