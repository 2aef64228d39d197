"""Expert parallelism's token dispatch (wired in by `workers/fsdp.py: apply_fsdp`): each rank of an ep group holds
E / ep of a MoE layer's routed experts, and every (token, chosen expert) pair goes to the rank that owns
the expert and comes back, by all-to-all.

    out = expert_parallel_experts(hidden, top_k_index, top_k_weights, local, group)

computes what the HF experts module (`Qwen3MoeExperts.forward(hidden, top_k_index, top_k_weights)`: [N, H], [N, k],
[N, k] -> [N, H]) computes with all E experts, with each rank holding only its own. Rank r owns experts
[r E/ep, (r + 1) E/ep). For the N x k pairs:

1. sort the pairs by owner (stable), count them per owner, and exchange the counts;
2. send each pair's token row and its expert's local index to the owner (`all_to_all_single`, the autograd form for
   the rows: the backward sends the rows' gradients back the same way);
3. the owner runs each of its experts on the rows it received (`local_experts`: one grouped GEMM per projection in
   bfloat16, the per-expert loop in float32);
4. send the results back, unsort, weight by the router's weights and sum over the k choices.

The gradients follow the same routes: each token's gradient is the sum over its k experts, and each expert's
weight gradient is the sum over every rank's tokens routed to it: what a single process with all E experts gets
from all ranks' tokens together. Exact to float32 rounding against it (tests/distributed/test_expert_parallel.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

LocalExperts = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(rows [M, H], local expert index [M]) -> each row through its expert, [M, H]."""


def gated_experts(
    gate_up_proj: torch.Tensor, down_proj: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
) -> LocalExperts:
    """The local experts of a Qwen2/Qwen3-MoE layer (HF's fused layout: gate_up_proj [E_local, 2I, H], down_proj
    [E_local, H, I]) as a per-expert loop: act(gate) * up, then down, as the HF module computes each expert."""

    def run(rows: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        # The rows and every local weight join the graph even where no row came: the backward then runs the
        # all-to-all that sent the rows on every rank (a collective: one rank without it would hang the others),
        # every rank has a gradient for each weight (zero where unused), FSDP reduces the same tensors on each rank
        # of efsdp, and the gradient norm sums the same meshes.
        out = rows * 0.0 + 0.0 * (gate_up_proj.sum() + down_proj.sum()).to(rows.dtype)
        for e in expert.unique().tolist():
            at = (expert == e).nonzero().squeeze(-1)
            gate, up = torch.nn.functional.linear(rows[at], gate_up_proj[e]).chunk(2, dim=-1)
            out = out.index_add(0, at, torch.nn.functional.linear(act(gate) * up, down_proj[e]).to(out.dtype))
        return out

    return run


def grouped_experts(
    gate_up_proj: torch.Tensor, down_proj: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
) -> LocalExperts:
    """The same local experts as one grouped GEMM per projection (`torch._grouped_mm`, bfloat16's path on CPU and
    CUDA): the rows sorted by expert, each group multiplied by its expert's weights, the rows put back in order."""

    def run(rows: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(expert, stable=True)
        ends = torch.cumsum(torch.bincount(expert, minlength=gate_up_proj.shape[0]), 0).to(torch.int32)
        gate, up = torch._grouped_mm(rows[order], gate_up_proj.transpose(-2, -1), offs=ends).chunk(2, dim=-1)
        done = torch._grouped_mm(act(gate) * up, down_proj.transpose(-2, -1), offs=ends)
        return done[torch.argsort(order)].to(rows.dtype)

    return run


def local_experts(
    gate_up_proj: torch.Tensor, down_proj: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
) -> LocalExperts:
    """The grouped GEMM where it runs (bfloat16 weights, rows of 16-byte multiples), else the per-expert loop."""
    grouped = gate_up_proj.dtype == torch.bfloat16 and gate_up_proj.shape[-1] % 8 == 0
    return (grouped_experts if grouped else gated_experts)(gate_up_proj, down_proj, act)


def expert_parallel_experts(
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    local: LocalExperts,
    experts_per_rank: int,
    group: dist.ProcessGroup,
) -> torch.Tensor:
    """hidden [N, H], the router's choices and weights [N, k] over all E experts -> [N, H], each rank running only
    the `experts_per_rank` experts it owns (`local`), over the ep `group` (every rank calls it, N may differ)."""
    n, k = top_k_index.shape
    ep = dist.get_world_size(group)
    flat = top_k_index.reshape(-1)
    owner = torch.div(flat, experts_per_rank, rounding_mode="floor")
    order = torch.sort(owner, stable=True).indices
    send = torch.bincount(owner, minlength=ep)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_sizes, recv_sizes = send.tolist(), recv.tolist()
    rows = hidden.repeat_interleave(k, dim=0)[order]  # pair p = token p // k, its choice p % k; sorted by owner
    expert = (flat - owner * experts_per_rank)[order]
    got_expert = torch.empty(sum(recv_sizes), dtype=expert.dtype, device=expert.device)
    dist.all_to_all_single(got_expert, expert, recv_sizes, send_sizes, group=group)
    got = dist_fn.all_to_all_single(
        hidden.new_empty(sum(recv_sizes), hidden.shape[1]), rows, recv_sizes, send_sizes, group=group
    )
    done = local(got, got_expert)
    back = dist_fn.all_to_all_single(rows.new_empty(rows.shape), done, send_sizes, recv_sizes, group=group)
    pairs = back[torch.argsort(order)].view(n, k, hidden.shape[1])  # unsorted: pair p at row p again
    return (pairs * top_k_weights[..., None].to(pairs.dtype)).sum(1)


def fused_experts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The routed-experts modules of a transformers MoE model in the fused layout (Qwen2-MoE, Qwen3-MoE:
    `num_experts`, `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I], `act_fn`), in module order."""

    def fused(m: torch.nn.Module) -> bool:
        gate_up, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
        params = isinstance(gate_up, torch.nn.Parameter) and isinstance(down, torch.nn.Parameter)
        return params and gate_up.dim() == 3 and hasattr(m, "num_experts")  # type: ignore[union-attr]

    return [m for m in model.modules() if fused(m)]


def shard_experts(model: torch.nn.Module, ep_mesh: DeviceMesh) -> int:
    """Make every fused-experts module of `model` expert-parallel over the 1-D `ep_mesh`, in place: its weights
    become DTensors sharded by expert over ep (`Shard(0)`; rank r keeps [r E/ep, (r + 1) E/ep), the global shape
    stays [E, ...], so DCP saves and loads them across a change of ep and `full_tensor()` gathers every expert),
    and its forward dispatches by `expert_parallel_experts` over this rank's experts. The rest of the model
    (attention, router, shared experts, dense layers) is untouched. Returns the modules changed.

    The forward is an instance attribute over the class's (as `workers/logprobs.py` swaps the LM head's): the HF
    modelling stays, so every architecture with this layout works. FSDP2 then shards each expert module's local
    experts over the remaining axis (`workers/fsdp.py`). With LoRA on the experts (PEFT's `ParamWrapper`s around the
    module) the forward adds this rank's experts' share of the adapters' update (`with_lora`), and the outermost
    wrapper calls the module straight (its parametrization would add all E experts' update)."""
    group = ep_mesh.get_group()
    ep, rank = ep_mesh.size(), ep_mesh.get_local_rank()
    modules = fused_experts(model)
    for module in modules:
        n_experts = int(cast(Any, module).num_experts)
        if n_experts % ep:
            raise ValueError(f"{n_experts} experts do not split over an ep group of {ep} ranks")
        per = n_experts // ep
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(module, name)  # every rank loaded the same weights: each keeps its experts, no message
            mine = full.detach()[rank * per : (rank + 1) * per].clone()
            sharded = DTensor.from_local(mine, ep_mesh, [Shard(0)], run_check=False)
            setattr(module, name, torch.nn.Parameter(sharded, requires_grad=full.requires_grad))

        adapters, outer = lora_wrappers(model, module)

        def forward(
            hidden: torch.Tensor,
            top_k_index: torch.Tensor,
            top_k_weights: torch.Tensor,
            module: torch.nn.Module = module,
            per: int = per,
            adapters: dict[str, Any] = adapters,
        ) -> torch.Tensor:
            w = cast(Any, module)  # the fused layout's attributes (`fused_experts`)
            gate_up, down = _local(w.gate_up_proj), _local(w.down_proj)
            if adapters:  # LoRA on the experts: each rank adds its own experts' share of the update
                gate_up = with_lora(gate_up, adapters.get("gate_up_proj"), rank * per)
                down = with_lora(down, adapters.get("down_proj"), rank * per)
            local = local_experts(gate_up, down, w.act_fn)
            return expert_parallel_experts(hidden, top_k_index, top_k_weights, local, per, group)

        module.forward = forward  # type: ignore[method-assign]
        if outer is not None:  # PEFT's wrapper would add the whole [E, ...] update to this rank's E / ep experts

            def through(*args: Any, module: torch.nn.Module = module, **kwargs: Any) -> torch.Tensor:
                return cast(torch.Tensor, module(*args, **kwargs))  # the call runs FSDP's hooks on the experts

            outer.forward = through  # type: ignore[method-assign]
    return len(modules)


def lora_wrappers(model: torch.nn.Module, experts: torch.nn.Module) -> tuple[dict[str, Any], torch.nn.Module | None]:
    """PEFT's LoRA wrappers of `experts`' fused parameters (`target_parameters`: one nested `ParamWrapper` per
    parameter), by parameter name, and the outermost wrapper (the module the MoE block calls); ({}, None) without."""
    wrappers = [
        m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "parameter_name") and m is not experts
    ]
    mine = [m for m in wrappers if cast(Any, m).get_base_layer() is experts]
    if not mine:
        return {}, None
    inner = {id(cast(Any, m).base_layer) for m in mine}
    outer = next(m for m in mine if id(m) not in inner)
    return {cast(Any, m).parameter_name: m for m in mine}, outer


def with_lora(
    weight: torch.Tensor, wrapper: Any, first: int, whole: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """`weight` (experts [first, first + len) of a fused parameter) plus their LoRA update from PEFT's `wrapper`
    (A [r E, in] viewed as [E, r, in], B [out, r E] as [out, r, E]: expert e's update is B[:, :, e] @ A[e], as
    `ParamWrapper.get_delta_weight` has it), for the wrapper's active adapters; `weight` as it is when they are off
    (`disable_adapter`: the reference as the base model) or merged. `whole`: how to read A and B whole (in the
    forward FSDP has gathered them; the weight sync gathers them itself)."""
    if wrapper is None or wrapper.disable_adapters or wrapper.merged:
        return weight
    last, whole = first + weight.shape[0], whole or (lambda t: t)
    for name in wrapper.active_adapters:
        if name not in wrapper.lora_A:
            continue
        experts = wrapper.num_experts
        a, b = whole(wrapper.lora_A[name].weight), whole(wrapper.lora_B[name].weight)
        a = a.reshape(experts, -1, a.shape[-1])[first:last]
        b = b.reshape(b.shape[0], -1, experts)[:, :, first:last]
        layout = "ore,eri->eoi" if wrapper._did_swap_in_out_features else "ore,eri->eio"  # [E, out, in] or [E, in, out]
        weight = weight + torch.einsum(layout, b, a).to(weight.dtype) * wrapper.scaling[name]
    return weight


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's experts of an expert-sharded weight (differentiable: the gradient comes back as the DTensor's)."""
    return t.to_local() if isinstance(t, DTensor) else t
