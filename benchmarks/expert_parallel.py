"""Expert-parallel benchmark: what actor.fsdp.expert_parallel_size changes per rank (`worker` on 4 gloo ranks).

A bespoke worker: the trainer reports neither the expert bytes a layer gathers nor the all-to-alls' time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from benchmarks import common
from torchrl_post.config.schema import FSDPConfig
from torchrl_post.distributed.env import end_process
from torchrl_post.distributed.placement import expert_mesh, fsdp_mesh
from torchrl_post.workers.actor import local_bytes
from torchrl_post.workers.expert_parallel import fused_experts
from torchrl_post.workers.fsdp import apply_fsdp
from torchrl_post.workers.optim import clip_grad_norm

NAME = "expert_parallel"
RANKS = 4
EPS = (1, 2, 4)
COLUMNS = [
    ("ep", "ep", "{}"), ("experts", "experts", "{}"), ("expert MiB gathered / layer / rank", "gathered_mib", "{:.2f}"),
    ("gathered x ep / layer's experts", "ratio", "{:.3f}"), ("params + AdamW MiB / rank", "kept_mib", "{:.1f}"),
    ("update s", "update_s", "{:.3f}"), ("all-to-all share", "all_to_all_share", "{:.1%}"),
]  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = {"experts": 8, "layers": 2, "repeats": 1} if args.quick or args.tiny else {}
    rows = []
    for ep in EPS:
        rec = common.run_worker(f"{NAME}_ep{ep}", "benchmarks.expert_parallel", RANKS, {"ep": ep, **shape})
        ranks = rec["ranks"]
        gathered = max(r["expert_bytes_gathered"] for r in ranks)
        rows.append({
            "ep": ep, "experts": rec["experts"], "gathered_mib": gathered / 2**20,
            "ratio": gathered * ep / ranks[0]["expert_bytes_per_layer"],
            "kept_mib": max(r["params_and_optimizer_bytes"] for r in ranks) / 2**20,
            "update_s": statistics.median(r["update_s"] for r in ranks),
            "all_to_all_share": statistics.median(r["all_to_all_share"] for r in ranks), "loadavg_1m": rec["loadavg_1m"],
        })  # fmt: skip
        print(f"ep {ep}: {rows[-1]}", flush=True)
    return {"ranks": RANKS, "rows": rows}


def worker(argv: list[str]) -> None:
    """Timed updates of a Qwen3-MoE under `apply_fsdp` at expert_parallel_size `--ep`, and the bytes per rank."""
    a = common.worker_args(worker.__doc__, argv, ep=1, experts=16, hidden=256, layers=4, tokens=1024, repeats=3)
    common.worker_init("cpu")
    world = dist.get_world_size()
    config = Qwen3MoeConfig(
        vocab_size=1024, hidden_size=a.hidden, intermediate_size=2 * a.hidden, moe_intermediate_size=a.hidden,
        num_hidden_layers=a.layers, num_attention_heads=a.hidden // 64, num_key_value_heads=2, head_dim=64,
        num_experts=a.experts, num_experts_per_tok=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    total = sum(p.numel() * p.element_size() for p in fused_experts(model)[0].parameters())
    experts = expert_mesh("cpu", world, a.ep) if a.ep > 1 else None
    apply_fsdp(model, fsdp_mesh("cpu", world, -1), FSDPConfig(param_dtype="float32"), experts=experts)
    gathered: list[int] = []  # each experts module's bytes as its forward runs (FSDP has gathered its unit)
    for module in fused_experts(model):
        module.register_forward_pre_hook(lambda m, _: gathered.append(sum(map(local_bytes, m.parameters()))))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1024, (1, a.tokens), generator=torch.Generator().manual_seed(dist.get_rank()))

    def update() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        clip_grad_norm(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    update()  # warm-up: AdamW's state exists from here
    seconds = []
    for _ in range(a.repeats):
        dist.barrier()
        start = time.perf_counter()
        update()
        seconds.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        update()
        profiled = time.perf_counter() - start
    a2a = sum(e.cpu_time_total for e in prof.key_averages() if "alltoall" in e.key.replace("_", "").lower()) / 1e6
    moments = [t for s in optimizer.state.values() for k, t in s.items() if k != "step" and isinstance(t, torch.Tensor)]
    kept, state = sum(map(local_bytes, model.parameters())), sum(map(local_bytes, moments))
    record = {
        "update_s": statistics.median(seconds), "all_to_all_share": a2a / profiled,
        "expert_bytes_gathered": max(gathered), "expert_bytes_per_layer": total, "params_and_optimizer_bytes": kept + state,
    }  # fmt: skip
    reports = common.all_gather(record)
    if dist.get_rank() == 0:
        common.write_json(a.out, {"ep": a.ep, "world": world, "experts": a.experts, "ranks": reports})
    end_process(0)


def markdown(rec: dict[str, Any]) -> str:
    rows = {r["ep"]: r for r in rec["rows"]}
    top = rows[max(rows)]
    return common.blocks(
        "## Expert parallelism",
        f"{rec['ranks']} ranks, float32, gloo.",
        common.table(rec["rows"], COLUMNS),
        f"At ep = {top['ep']} a rank gathers {top['gathered_mib']:.2f} MiB of a layer's experts against "
        f"{rows[1]['gathered_mib']:.2f} MiB at ep = 1 (gathered x ep / all = {top['ratio']:.3f}); the parameters and "
        "AdamW state it keeps do not change (the experts are sharded over every rank either way). The all-to-alls "
        f"take {top['all_to_all_share']:.0%} of its update: {rec['ranks']} ranks on shared CPUs over gloo, the share "
        "counts the wait for the slowest rank.",
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    rows = rec["rows"]
    fig, (left, right) = common.subplots(1, 2, figsize=(9, 3.5))
    eps = [str(r["ep"]) for r in rows]
    left.bar(eps, [r["gathered_mib"] for r in rows])
    left.set(xlabel="expert_parallel_size", ylabel="MiB", title="experts gathered per layer per rank")
    right.bar(eps, [r["update_s"] for r in rows], label="update")
    right.bar(eps, [r["update_s"] * r["all_to_all_share"] for r in rows], label="all-to-all")
    right.set(xlabel="expert_parallel_size", ylabel="s", title="one update")
    right.legend()
    common.save_figure(fig, path)


if __name__ == "__main__":
    common.standalone()
