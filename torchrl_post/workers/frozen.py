"""One way to build a frozen role (the reference, the reward model): its model under FSDP2 in inference mode.

A frozen role never trains: its parameters take no gradient, every module reshards after forward
(`apply_fsdp(frozen=True)`), and its host offload follows its own `param_offload` alone. Its shards are read
straight from its checkpoint where `model.load_format=sharded` allows (workers/loading.py). A new frozen role is a
small class over `frozen_model` and a plan entry; on ranks of its own, `workers/remote.py`'s `RoleServer` serves it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.distributed.device_mesh import DeviceMesh

from torchrl_post.config.schema import FSDPConfig, ModelConfig
from torchrl_post.workers.loading import Build, fsdp_model


def frozen_model(
    build: Build,
    model_cfg: ModelConfig,
    mesh: DeviceMesh,
    fsdp: FSDPConfig,
    device: torch.device,
    *,
    role: str,
    param_offload: bool,
    path: str | None = None,
    experts: DeviceMesh | None = None,
) -> torch.nn.Module:
    """`build(empty)` (the model at `path`, default `model.path`) sharded over `mesh` with the actor's FSDP
    settings `fsdp` but for the offload (`param_offload`), frozen and in eval mode; `experts`: expert
    parallelism's mesh (`apply_fsdp`)."""
    fsdp = replace(fsdp, offload_policy=param_offload)
    model = fsdp_model(build, model_cfg, mesh, fsdp, device, role=role, path=path, frozen=True, experts=experts)
    model.requires_grad_(False)
    return model.eval()
