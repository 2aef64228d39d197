"""Run under torchrun by benchmarks/expert_parallel.py: updates of a Qwen3-MoE wrapped by the trainer's own
`apply_fsdp` at expert_parallel_size `--ep` (float32, gloo), timed; the all-to-alls' seconds from the profiler; the
expert bytes each rank gathers per layer; the parameters and AdamW state each rank keeps."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from benchmarks import common
from torchrl_post.config.schema import FSDPConfig
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import expert_mesh, fsdp_mesh
from torchrl_post.workers.expert_parallel import fused_experts
from torchrl_post.workers.fsdp import apply_fsdp
from torchrl_post.workers.optim import clip_grad_norm, local_tensor


def main() -> None:
    a = common.worker_args(__doc__, ep=1, experts=16, hidden=256, layers=4, tokens=1024, repeats=3)
    env = read_env("cpu")
    init_world(env)
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
        module.register_forward_pre_hook(
            lambda m, _: gathered.append(sum(local_tensor(p).numel() * p.element_size() for p in m.parameters()))
        )
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
    kept = sum(local_tensor(p).numel() * p.element_size() for p in model.parameters())
    moments = [t for s in optimizer.state.values() for k, t in s.items() if k != "step" and isinstance(t, torch.Tensor)]
    state = sum(local_tensor(t).numel() * t.element_size() for t in moments)
    record = {
        "update_s": statistics.median(seconds), "all_to_all_share": a2a / profiled,
        "expert_bytes_gathered": max(gathered), "expert_bytes_per_layer": total, "params_and_optimizer_bytes": kept + state,
    }  # fmt: skip
    reports: list = [None] * world
    dist.all_gather_object(reports, record)
    if dist.get_rank() == 0:
        common.write_json(a.out, {"ep": a.ep, "world": world, "experts": a.experts, "ranks": reports})
    end_process(0)


if __name__ == "__main__":
    main()
