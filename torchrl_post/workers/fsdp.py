"""Models for the trained and frozen roles: load an HF model from disk, then FSDP2 (each decoder layer, then
the root) over a role's mesh."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from torchrl_post.config.precision import resolve_dtype
from torchrl_post.config.schema import FSDPConfig
from torchrl_post.workers.expert_parallel import fused_experts, shard_experts


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of an HF causal LM (model.model.layers for Llama/Qwen-style), also
    through a PEFT wrapper; a vision-language model's vision blocks (model.model.visual.blocks) and its
    language model's layers (model.model.language_model.layers)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    inner = getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is not None:
        return list(layers)
    language, visual = getattr(inner, "language_model", None), getattr(inner, "visual", None)
    if language is not None and getattr(language, "layers", None) is not None:
        return [*getattr(visual, "blocks", []), *language.layers]
    raise ValueError(f"{type(model).__name__}: cannot find decoder layers at model.model.layers to shard")


def apply_fsdp(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    cfg: FSDPConfig,
    *,
    frozen: bool = False,
    experts: DeviceMesh | None = None,
) -> torch.nn.Module:
    """Shard per decoder layer and at the root; parameters become DTensors on the mesh's device.

    `experts`: expert parallelism's sparse (efsdp, ep) mesh (with HSDP (dp_replicate, efsdp, ep)). Each MoE
    layer's routed experts are first split by expert over ep (`shard_experts`: this rank keeps E / ep of them and
    dispatches tokens by all-to-all), then FSDP-shards them over efsdp (HSDP: replicated over dp_replicate), a
    unit of their own inside the layer's. Their gradients are reduced over efsdp,
    but each already sums its ep group's tokens (the all-to-all's backward), so they are divided by all the
    mesh's ranks, as the dense gradients are: the same update as with every expert everywhere.

    `cfg.offload_policy` puts FSDP2's CPUOffloadPolicy on every `fully_shard` call: the sharded parameters,
    their gradients and so the optimizer state live in CPU memory (pinned on an accelerator), each layer is
    copied to the device for its all-gather, and the optimizer steps on CPU. On a CPU mesh it changes no
    placement. `frozen`: a forward-only model (the reference): every module, the root too, reshards after
    forward whatever `cfg.reshard_after_forward` says, since no backward follows to reuse gathered parameters
    (a no-grad forward never reshards a module that keeps them).
    """
    mp = MixedPrecisionPolicy(
        param_dtype=getattr(torch, resolve_dtype(cfg.param_dtype, mesh.device_type)),
        reduce_dtype=getattr(torch, cfg.reduce_dtype),
    )
    extra: dict[str, Any] = {}
    if cfg.offload_policy:
        extra["offload_policy"] = CPUOffloadPolicy(pin_memory=mesh.device_type != "cpu")
    layer_reshard = frozen or cfg.reshard_after_forward
    if experts is not None:
        shard_experts(model, experts["ep"])
        dims = tuple(d for d in experts.mesh_dim_names or () if d != "ep")  # efsdp; HSDP: (dp_replicate, efsdp)
        spread = experts[dims] if len(dims) > 1 else experts[dims[0]]
        for module in fused_experts(model):
            fully_shard(module, mesh=spread, mp_policy=mp, reshard_after_forward=layer_reshard, **extra)
            unit = cast(FSDPModule, module)
            unit.set_gradient_divide_factor(float(mesh.size()))
            # Over more than one rank: a sum, then the division (gloo has no pre-scaled sum). Over one rank
            # torch 2.13 divides in the copy that stands for the reduction and, forced, once more after it
            # (with HSDP the replicas' all-reduce is a sum either way).
            unit.set_force_sum_reduction_for_comms(experts["efsdp"].size() > 1)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=layer_reshard, **extra)
    # A trained root keeps its parameters (embeddings, final norm, lm_head) gathered after forward: backward
    # needs them right away.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=frozen, **extra)
    return model


def reshard(model: torch.nn.Module) -> None:
    """Free every gathered parameter of an FSDP2 model (each module with parameters of its own, the root
    included). A no-grad forward leaves the modules that do not reshard after forward (the root, every layer
    with `reshard_after_forward=false`) gathered until a backward that never comes: call this after one."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
