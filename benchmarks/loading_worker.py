"""Worker for benchmarks/loading.py (run under torchrun): one actor loaded by `model.load_format`, the peak host
memory it took on this rank: the high-water RSS (`ru_maxrss`) after the load minus the RSS just before (tensors,
the safetensors pages the rank touched, transient copies). Rank 0 writes every rank's numbers."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks import common
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    args = common.worker_args(__doc__, model=str, format=str)
    env = read_env("auto")
    init_world(env)
    cfg = Config()
    cfg.model.path, cfg.model.load_format = args.model, args.format
    mesh = fsdp_mesh(env.device.type, env.world_size, -1)
    dist.barrier()
    before = rss_kb()
    t0 = time.perf_counter()
    actor = common.build_actor(cfg, mesh, env.device)
    dist.barrier()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    params = list(actor.model.parameters())
    mine = {
        "rank": env.rank, "peak_growth_bytes": (peak - before) * 1024, "after_bytes": (rss_kb() - before) * 1024,
        "shard_bytes": sum(p.to_local().numel() * p.element_size() for p in params), "seconds": seconds,
    }  # fmt: skip
    gathered: list[object] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    if env.rank == 0:
        n = sum(p.numel() for p in params)
        common.write_json(args.out, {
            "format": args.format, "ranks": env.world_size, "num_params": n,
            "model_bytes": n * params[0].element_size(), "per_rank": gathered, "device": str(env.device),
        })  # fmt: skip
    del actor, params
    dist.barrier()  # every rank done with the group before teardown (a rank leaving early aborted the other)
    end_process()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
