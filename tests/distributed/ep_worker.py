"""Run under torchrun by test_expert_parallel.py: `workers/expert_parallel.py` against transformers' own
Qwen3MoeExperts holding all experts. Every rank routes its own tokens (a different count on each, one case with none
on the last rank, one where every token of the last rank goes to the first rank's experts); the output, the tokens'
gradients and each rank's experts' weight gradients (summed over every rank's tokens in the reference) must match.

torchrun --nproc-per-node N tests/distributed/ep_worker.py <out.json>
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

from tests.distributed.device import worker_env
from torchrl_post.distributed.env import end_process, init_world
from torchrl_post.workers.expert_parallel import expert_parallel_experts, gated_experts

E, H, INTER, K = 8, 16, 8, 2


def _case(rank: int, world: int, tokens: int, to_first: bool) -> dict[str, float]:
    config = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=INTER, num_experts=E, hidden_act="silu")
    torch.manual_seed(0)  # the same experts on every rank
    full = Qwen3MoeExperts(config)
    with torch.no_grad():
        full.gate_up_proj.normal_(0, 0.3)
        full.down_proj.normal_(0, 0.3)
    gen = torch.Generator().manual_seed(10 + rank)
    hidden = torch.randn(tokens, H, generator=gen)
    per_rank = E // world
    pool = per_rank if to_first else E  # the last rank's tokens all go to rank 0's experts
    index = (
        torch.stack([torch.randperm(pool, generator=gen)[:K] for _ in range(tokens)])
        if tokens
        else torch.zeros(0, K, dtype=torch.long)
    )
    weights = torch.softmax(torch.randn(tokens, K, generator=gen), -1)
    g = torch.randn(tokens, H, generator=gen)
    # the reference: all experts here, on this rank's tokens; the weight gradients summed over the ranks
    x_ref = hidden.clone().requires_grad_()
    out_ref = full(x_ref, index, weights)
    if tokens:  # (with none, HF's module returns zeros with no graph)
        (out_ref * g).sum().backward()
    params = (full.gate_up_proj, full.down_proj)
    grads_ref = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    for t in grads_ref:
        dist.all_reduce(t)
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    gate_up = full.gate_up_proj.detach()[mine].clone().requires_grad_()
    down = full.down_proj.detach()[mine].clone().requires_grad_()
    x = hidden.clone().requires_grad_()
    out = expert_parallel_experts(
        x, index, weights, gated_experts(gate_up, down, full.act_fn), per_rank, dist.group.WORLD
    )
    (out * g).sum().backward()  # every rank, tokens or none: the backward's all-to-all needs them all
    return {
        "out": (out - out_ref).abs().max().item() if tokens else 0.0,
        "d_hidden": (x.grad - x_ref.grad).abs().max().item() if tokens else 0.0,  # type: ignore[operator]
        "d_gate_up": (gate_up.grad - grads_ref[0][mine]).abs().max().item(),  # type: ignore[operator]
        "d_down": (down.grad - grads_ref[1][mine]).abs().max().item(),  # type: ignore[operator]
        "d_scale": max(t[mine].abs().max().item() for t in grads_ref),
        "out_scale": out_ref.abs().max().item() if tokens else 0.0,
    }


def main() -> None:
    out_path = sys.argv[1]
    env = worker_env()
    init_world(env)
    rank, world = env.rank, env.world_size
    last = rank == world - 1
    report: dict[str, Any] = {
        "uneven": _case(rank, world, 5 + 3 * rank, to_first=False),
        "none_on_last": _case(rank, world, 0 if last else 6, to_first=False),
        "last_to_first": _case(rank, world, 7, to_first=last),
    }
    reports: list[Any] = [None] * world
    dist.all_gather_object(reports, report)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(reports, f)
    end_process(0)


if __name__ == "__main__":
    main()
