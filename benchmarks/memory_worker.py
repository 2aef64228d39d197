"""FSDP2 memory per rank, counted: parameters, gradients and AdamW state of each rank's shards.

    torchrun --standalone --nproc-per-node K benchmarks/memory_worker.py --model DIR --out FILE

The model is wrapped as the actor wraps it (`workers.fsdp.apply_fsdp`, one FSDP unit per decoder layer and the
root, over a 1-D mesh of the K ranks; the optimizer from `workers.optim.build_optimizer`), then one forward and
backward of a small random batch and one optimizer step. Per rank it counts the bytes of its local shards
(`DTensor.to_local()`): parameters, gradients after the backward, optimizer state after the step (exp_avg,
exp_avg_sq, step), and the same tensors' storage (FSDP2 pads each parameter's dim 0 to a multiple of K, so a
rank may hold padding beyond its share). The unsharded totals are the full tensors' bytes (DTensor's global
shape). These are counts of tensors, not the process's memory: activations, gathered parameters during
forward/backward and the allocator's caches come on top. Rank 0 writes one JSON record with every rank's counts.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchrl_post.config.schema import FSDPConfig, ModelConfig
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.workers.fsdp import apply_fsdp
from torchrl_post.workers.models import load_causal_lm
from torchrl_post.workers.optim import build_optimizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def count(tensors: Iterable[torch.Tensor]) -> dict[str, int]:
    """Bytes of the local shards, of their (deduplicated) storages, and of the full tensors."""
    shard = storage = full = 0
    seen: set[int] = set()
    for t in tensors:
        lt = local(t)
        shard += lt.numel() * lt.element_size()
        full += t.numel() * t.element_size()  # a DTensor's numel is its global one
        st = lt.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            storage += st.nbytes()
    return {"shard": shard, "storage": storage, "full": full}


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def main() -> None:
    args = parse_args()
    env = read_env("auto")  # cuda (nccl) where there is one, else cpu (gloo)
    init_world(env)
    mesh = fsdp_mesh(env.device.type, env.world_size, -1)
    model_cfg = ModelConfig(path=str(args.model.resolve()))
    model: Any = load_causal_lm(model_cfg)
    model.config.use_cache = False
    model = apply_fsdp(model, mesh, FSDPConfig())
    optimizer, _ = build_optimizer(model, lr=1e-4, weight_decay=0.0, schedule=lambda step: 1.0)
    params = list(model.parameters())
    counts: dict[str, Any] = {"params": count(params)}

    gen = torch.Generator().manual_seed(env.rank)
    ids = torch.randint(5, model.config.vocab_size, (args.batch, args.seq_len), generator=gen).to(env.device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    counts["grads"] = count(p.grad for p in params if p.grad is not None)
    optimizer.step()
    counts["optimizer"] = count(optimizer_tensors(optimizer))

    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, counts)
    if env.rank == 0:
        rec = {
            "model": args.model.name,
            "ranks": env.world_size,
            "device": env.device.type,
            "num_params": sum(p.numel() for p in params),
            "dtype": str(params[0].dtype).removeprefix("torch."),
            "per_rank": gathered,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rec, indent=1) + "\n")
    dist.barrier()  # no rank tears gloo down while another still talks to it (an abort at exit otherwise)
    end_process()


if __name__ == "__main__":
    main()
