"""Run under torchrun by test_expert_parallel.py: `workers/expert_parallel.py` against transformers' own
Qwen3MoeExperts holding all experts. Every rank routes its own tokens (a different count on each, one case with none
on the last rank, one where every token of the last rank goes to the first rank's experts); the output, the tokens'
gradients and each rank's experts' weight gradients (summed over every rank's tokens in the reference) must match.

torchrun --nproc-per-node N tests/distributed/ep_worker.py <out.json>
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts, Qwen3MoeForCausalLM

from tests.distributed.device import worker_env, write_reports
from torchrl_post.distributed.env import init_world
from torchrl_post.workers.expert_parallel import (
    _local,
    expert_parallel_experts,
    fused_experts,
    gated_experts,
    shard_experts,
)

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


def _tiny_moe(experts: int) -> Qwen3MoeForCausalLM:
    """A tiny Qwen3-MoE (2 MoE layers, top-2) drawn from seed 0, with routers that spread the tokens over the experts."""
    config = Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=experts, num_experts_per_tok=K,
        decoder_sparse_step=1, tie_word_embeddings=False, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    return model


def _model_case(rank: int, world: int) -> dict[str, float]:
    """A whole tiny Qwen3-MoE (2 MoE layers, 8 experts, top-2) made expert-parallel by `shard_experts`, against the
    same model with every expert, each rank on its own token rows: logits, every dense parameter's gradient (this
    rank's tokens' own), every expert's weight gradient (the reference's summed over the ranks)."""
    ref = _tiny_moe(E)
    model = copy.deepcopy(ref)
    assert shard_experts(model, init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))) == 2
    gen = torch.Generator().manual_seed(30 + rank)
    ids = torch.randint(0, 64, (2, 6 + rank), generator=gen)
    g = torch.randn(2, 6 + rank, 64, generator=gen)
    out: dict[str, float] = {}
    logits = {}
    for name, m in (("ref", ref), ("ep", model)):
        logits[name] = m(input_ids=ids).logits
        (logits[name] * g).sum().backward()
    out["logits"] = (logits["ep"] - logits["ref"]).abs().max().item()
    ep_grads = dict(model.named_parameters())
    per = E // world
    mine = slice(rank * per, (rank + 1) * per)
    dense, experts, scale = 0.0, 0.0, 0.0
    for name, p in ref.named_parameters():
        assert p.grad is not None, name
        mirror = ep_grads[name].grad
        assert mirror is not None, name
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            total = p.grad.clone()
            dist.all_reduce(total)
            assert isinstance(mirror, DTensor) and mirror.shape == p.grad.shape  # the global [E, ...] shape
            experts = max(experts, (mirror.to_local() - total[mine]).abs().max().item())
            assert mirror.to_local().shape[0] == per
        else:
            dense = max(dense, (mirror - p.grad).abs().max().item())
        scale = max(scale, p.grad.abs().max().item())
    return {"logits": out["logits"], "dense": dense, "experts": experts, "scale": scale}


def _fsdp_case(
    world: int, ep: int, param_dtype: str = "float32", fsdp_size: int = -1, device: torch.device | None = None
) -> dict[str, Any]:
    """The trainer's own wrapping (`apply_fsdp` over the dense mesh, with and without expert parallelism's (efsdp,
    ep) mesh): a tiny Qwen3-MoE with 4 experts, each rank on its own tokens, one backward, the clipped gradient
    norm and an AdamW step. The ep run's gradients (gathered whole), norm and updated weights against ep = 1's.
    `fsdp_size` < world: HSDP, both runs (the experts over (dp_replicate, efsdp, ep)). `device`: where the ranks
    compute (tests/distributed/device.py; CPU by default)."""
    from torchrl_post.config.schema import FSDPConfig
    from torchrl_post.distributed.placement import expert_mesh, fsdp_mesh
    from torchrl_post.workers.fsdp import apply_fsdp
    from torchrl_post.workers.optim import clip_grad_norm

    device = device or torch.device("cpu")
    base = _tiny_moe(4).to(device)
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(50 + rank)
    ids = torch.randint(0, 64, (2, 5 + rank), generator=gen).to(device)
    g = torch.randn(2, 5 + rank, 64, generator=gen).to(device)
    cfg = FSDPConfig(param_dtype=param_dtype)  # bfloat16: the experts' grouped GEMM against transformers' own
    grads: dict = {}
    norms, weights, gathered = {}, {}, {}
    for name, size in (("ref", 1), ("ep", ep)):
        model = copy.deepcopy(base)
        layer_experts = sum(p.numel() for p in fused_experts(model)[0].parameters())
        mesh = expert_mesh(device.type, world, size, fsdp_size) if size > 1 else None
        apply_fsdp(model, fsdp_mesh(device.type, world, fsdp_size), cfg, experts=mesh)
        held: list[float] = []  # what each experts module holds as its forward runs (FSDP gathered it), x ep / all
        for m in fused_experts(model):
            m.register_forward_pre_hook(
                lambda m, _, n=size, out=held, whole=layer_experts: out.append(
                    n * sum(_local(p).numel() for p in m.parameters()) / whole
                )
            )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        (model(input_ids=ids).logits * g).sum().backward()
        grads[name] = {n: p.grad.full_tensor() for n, p in model.named_parameters()}  # type: ignore[union-attr]
        gathered[name] = held
        norms[name] = clip_grad_norm(model, 1.0)
        opt.step()
        weights[name] = {n: p.full_tensor() for n, p in model.named_parameters()}  # type: ignore[attr-defined]
    sync = _sync_case(model, weights["ep"])
    ref = grads["ref"]
    return {
        "grad": max((grads["ep"][n] - ref[n]).abs().max().item() for n in ref),
        "grad_scale": max(t.abs().max().item() for t in ref.values()),
        "norm": abs(norms["ep"] - norms["ref"]),
        "norm_value": norms["ref"],
        "weights": max((weights["ep"][n] - weights["ref"][n]).abs().max().item() for n in ref),
        "moved": max((weights["ref"][n] - p).abs().max().item() for n, p in base.named_parameters()),
        "gathered": [min(gathered["ep"]), max(gathered["ep"]), len(gathered["ep"])],
        **sync,
    }


def _sync_case(model: torch.nn.Module, whole: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The weight sync's stream (`iter_full_weights`, small buckets) of an expert-parallel model: its experts as
    per-expert checkpoint tensors (one ep block at a time), which put back into their fused parameters give every
    parameter's whole value."""
    from torchrl_post.sync.weights import iter_full_weights
    from torchrl_post.workers.loading import expert_pieces

    pieces = expert_pieces(model)
    rebuilt = {n: torch.full_like(t, float("nan")) for n, t in whole.items()}
    sent = []
    for name, t in iter_full_weights(model, 1 << 12):
        sent.append(name)
        if name in pieces:
            fused, expert, part, parts = pieces[name]
            rebuilt[fused][expert].chunk(parts)[part].copy_(t)
        else:
            rebuilt[name].copy_(t)
    fused = {f for f, *_ in pieces.values()}
    return {
        "sync": max((rebuilt[n] - t).abs().max().item() for n, t in whole.items()),  # nan (a hole) fails too
        "sync_fused_sent": sum(1 for n in sent if n in fused),  # a fused [E, ...] tensor gathered whole
        "sync_pieces": sum(1 for n in sent if n in pieces),
    }


def main() -> None:
    out_path = sys.argv[1]
    env = worker_env()
    init_world(env)
    rank, world = env.rank, env.world_size
    if env.device.type == "cuda":  # the GPU tier (tests/gpu/checks.py, `expert_parallel`): the trainer's wrapping
        cases = {f"fsdp_ep{ep}": (ep, "float32") for ep in sorted({2, world})} | {"fsdp_bf16": (world, "bfloat16")}
        report = {key: _fsdp_case(world, ep, dtype, device=env.device) for key, (ep, dtype) in cases.items()}
        write_reports(report | {"device": str(env.device), "backend": env.backend}, out_path)
        return
    last = rank == world - 1
    report: dict[str, Any] = {
        "uneven": _case(rank, world, 5 + 3 * rank, to_first=False),
        "none_on_last": _case(rank, world, 0 if last else 6, to_first=False),
        "last_to_first": _case(rank, world, 7, to_first=last),
    }
    report["model"] = _model_case(rank, world)
    for ep in sorted({2, world}):
        report[f"fsdp_ep{ep}"] = _fsdp_case(world, ep)
    report["fsdp_bf16"] = _fsdp_case(world, world, "bfloat16")
    if world == 4:  # HSDP: 2 replicas of 2 shards, ep = 2 within each
        report["hsdp_ep2"] = _fsdp_case(world, 2, fsdp_size=2)
    write_reports(report, out_path)


if __name__ == "__main__":
    main()
