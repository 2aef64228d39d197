"""Weights from safetensors straight into FSDP2 shards (`model.load_format=sharded`).

The model is built with its parameters on the meta device (buffers, such as rotary frequencies, are real and
small), sharded with `apply_fsdp`, given empty local shards, and each rank then reads only its own rows of each
tensor from the safetensors files (`safe_open(...).get_slice`): host memory per rank is about 1/ranks of the
model plus one tensor's rows, instead of every rank holding the whole model before sharding. The values equal a
plain `from_pretrained` (tested). A checkpoint whose tensor names do not cover the model's parameters (models
whose loading renames keys, e.g. some vision-language checkpoints) and LoRA models (PEFT builds its adapter on
loaded weights) load in full, with one log line saying so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from torchrl_post.config.schema import FSDPConfig, ModelConfig
from torchrl_post.workers.fsdp import apply_fsdp

log = logging.getLogger(__name__)

Build = Callable[[bool], torch.nn.Module]
"""build(empty) -> the model: loaded from disk (empty=False) or with its parameters on the meta device."""


@contextmanager
def params_on_meta() -> Iterator[None]:
    """Every parameter registered inside lands on the meta device (no memory, no init work); buffers stay real."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def checkpoint_files(path: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (model.safetensors or an index's shards)."""
    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: root / file for name, file in weight_map.items()}
    out: dict[str, Path] = {}
    for file in sorted(root.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out |= dict.fromkeys(f.keys(), file)
    return out


def fsdp_model(
    build: Build,
    model_cfg: ModelConfig,
    mesh: DeviceMesh,
    fsdp: FSDPConfig,
    device: torch.device,
    *,
    role: str,
    path: str | None = None,
    frozen: bool = False,
    fresh: dict[str, float] | None = None,
) -> torch.nn.Module:
    """A role's model under FSDP2 (`apply_fsdp`), its shards read straight from the checkpoint at `path`
    (default `model.path`) when `model.load_format=sharded` allows, else loaded in full and then sharded.
    `fresh`: parameters the checkpoint does not have (a critic's value head) -> the std of their normal init,
    drawn identically on every rank from a fixed seed."""
    fresh = fresh or {}
    if model_cfg.load_format == "sharded" and model_cfg.lora_rank == 0:
        model = build(True)
        files = checkpoint_files(path or model_cfg.path)
        params = dict(model.named_parameters())
        missing = sorted(n for n in params if n not in files and n not in fresh)
        if not missing:
            apply_fsdp(model, mesh, fsdp, frozen=frozen)
            _materialize(model, torch.device("cpu") if fsdp.offload_policy else device)
            _fill(model, files, fresh)
            return model
        log.info(
            "model.load_format=sharded: %s loads in full (the checkpoint names none of %s%s)",
            role,
            ", ".join(missing[:3]),
            " ..." if len(missing) > 3 else "",
        )
        del model
    elif model_cfg.load_format == "sharded" and role == "actor":
        log.info("model.load_format=sharded: a LoRA model loads in full (PEFT builds its adapter on loaded weights)")
    return apply_fsdp(build(False), mesh, fsdp, frozen=frozen)


def _materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Empty local shards on `device` for every meta parameter; buffers keep their values."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])


@torch.no_grad()
def _fill(model: torch.nn.Module, files: dict[str, Path], fresh: dict[str, float]) -> None:
    """Each parameter's local block from its file (only that block is read), or a fresh normal init."""
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for name, param in model.named_parameters():
            local = param.to_local() if isinstance(param, DTensor) else param.data
            if local.numel() == 0:
                continue
            if isinstance(param, DTensor):
                shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
            else:
                shape, offset = tuple(param.shape), (0,) * param.dim()
            block = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
            if name in fresh:
                gen = torch.Generator().manual_seed(0)
                full = torch.empty(param.shape, dtype=torch.float32).normal_(0.0, fresh[name], generator=gen)
                local.copy_(full[block])
                continue
            file = files[name]
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(str(file), framework="pt"))
            local.copy_(handles[file].get_slice(name)[block] if block else handles[file].get_tensor(name))
