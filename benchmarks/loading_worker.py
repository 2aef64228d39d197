"""Worker for benchmarks/loading.py (run under torchrun): one role model loaded by `model.load_format`, the
peak host memory it took on this rank.

    torchrun --standalone --nproc-per-node N benchmarks/loading_worker.py --model DIR --format sharded|full --out F

Peak memory is the process's high-water RSS (`ru_maxrss`) after the load minus its RSS just before: the model's
tensors, what loading read through (safetensors maps its files; the pages a rank touches count in its RSS) and
any transient copy. Written by rank 0 for every rank.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist

from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.workers.actor import Actor


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--format", choices=("sharded", "full"), required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    env = read_env("auto")
    init_world(env)
    cfg = Config()
    cfg.model.path, cfg.model.load_format = args.model, args.format
    mesh = fsdp_mesh(env.device.type, env.world_size, -1)
    dist.barrier()
    before = rss_kb()
    t0 = time.perf_counter()
    actor = Actor(
        cfg.model,
        cfg.actor,
        mesh,
        env.device,
        temperature=1.0,
        mini_batch_samples=1,
        micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu,
        max_response_length=8,
        total_steps=1,
    )
    dist.barrier()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    params = sum(p.numel() for p in actor.model.parameters())
    local = sum(p.to_local().numel() * p.element_size() for p in actor.model.parameters())  # type: ignore[attr-defined,operator]
    mine = {
        "rank": env.rank,
        "peak_growth_bytes": (peak - before) * 1024,
        "after_bytes": (rss_kb() - before) * 1024,
        "shard_bytes": local,
        "seconds": seconds,
    }
    gathered: list[object] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    if env.rank == 0:
        p = next(actor.model.parameters())
        rec = {
            "format": args.format,
            "ranks": env.world_size,
            "num_params": params,
            "model_bytes": params * p.element_size(),
        }
        Path(args.out).write_text(json.dumps({**rec, "per_rank": gathered, "device": str(env.device)}))
    del actor
    dist.barrier()  # every rank done with the group before teardown (a rank leaving early aborted the other)
    end_process()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
