"""Weights from safetensors straight into FSDP2 shards (`model.load_format=sharded`).

The model is built with its parameters on the meta device (buffers, such as rotary frequencies, are real and
small), sharded with `apply_fsdp`, given empty local shards, and each rank then reads only its own rows of each
tensor from the safetensors files (positioned reads of its rows, no memory map): host memory per rank is about 1/ranks of the
model plus one tensor's rows, instead of every rank holding the whole model before sharding. The values equal a
plain `from_pretrained` (tested). Checkpoint names are read as transformers reads them (`checkpoint_names`: a
Qwen2-VL checkpoint's `model.layers.*` and `visual.*` are the model's `model.language_model.*` and
`model.visual.*`). A checkpoint whose tensors do not cover the model's parameters under those names, or that
transformers would convert on load (split, merged), and LoRA models (PEFT builds its adapter on loaded weights)
load in full, with one log line saying so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import AutoConfig
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

from torchrl_post.config.schema import FSDPConfig, ModelConfig
from torchrl_post.workers.fsdp import apply_fsdp
from torchrl_post.workers.models import empty_model

log = logging.getLogger(__name__)

Build = Callable[[bool], torch.nn.Module]
"""build(empty) -> the model: loaded from disk (empty=False) or with its parameters on the meta device."""


def checkpoint_files(path: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (model.safetensors or an index's shards)."""
    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: root / file for name, file in weight_map.items()}
    out: dict[str, Path] = {}
    for file in sorted(root.glob("*.safetensors")):
        f = SafetensorsFile(file)
        f.close()
        out |= dict.fromkeys((k for k in f.header if k != "__metadata__"), file)
    return out


def checkpoint_names(model_cfg: ModelConfig, path: str | Path, keys: list[str]) -> dict[str, str]:
    """The model's parameter name -> the checkpoint tensor (of `keys`) that transformers loads into it.

    transformers renames keys on load (its conversion mapping: Qwen2-VL and Qwen2.5-VL checkpoints keep the
    names from before their models were split into a language model and a vision tower, `model.layers.*` and
    `visual.*`, which load as `model.language_model.layers.*` and `model.visual.*`). The same renaming is applied
    here, computed on the model class `from_pretrained` uses (`model_class`, built on the meta device); a role's
    own model shares those names (a critic's backbone is that model's `model`). Keys that transformers would
    convert, not only rename (split or merged tensors), are left out: their rows are not the file's rows. The
    renaming functions are transformers 5's loading internals (pinned to 5.16-5.19 in pyproject.toml)."""
    config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    model = empty_model(model_cfg, config)
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    meta = model.state_dict()
    out = {}
    for key in keys:
        name, converted = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
        if converted is None:
            out[name] = key
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
        names = checkpoint_names(model_cfg, path or model_cfg.path, list(files))
        sources = {name: (files[key], key) for name, key in names.items()}
        missing = sorted(n for n, _ in model.named_parameters() if n not in sources and n not in fresh)
        if not missing:
            apply_fsdp(model, mesh, fsdp, frozen=frozen)
            _materialize(model, torch.device("cpu") if fsdp.offload_policy else device)
            _fill(model, sources, fresh)
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


SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsFile:
    """One safetensors file read with plain positioned reads: a block of whole rows of a tensor is one
    contiguous byte range, read straight into its destination. No memory map, so the pages read do not stay in
    this process's memory (they are the kernel's page cache, shared and reclaimable)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        (size,) = struct.unpack("<Q", os.pread(self.fd, 8, 0))
        self.header: dict[str, Any] = json.loads(os.pread(self.fd, size, 8))
        self.data_start = 8 + size

    def close(self) -> None:
        os.close(self.fd)

    def read_rows(self, name: str, start: int, stop: int, out: torch.Tensor) -> None:
        """Rows start:stop of tensor `name` (dim 0; the whole tensor for a scalar) into `out`, cast to its dtype."""
        info = self.header[name]
        dtype, shape = SAFETENSORS_DTYPES[info["dtype"]], info["shape"]
        row_bytes = math.prod(shape[1:]) * dtype.itemsize if shape else dtype.itemsize
        first = self.data_start + info["data_offsets"][0] + start * row_bytes
        direct = out.dtype == dtype and out.device.type == "cpu" and out.is_contiguous()
        buf = out if direct else torch.empty(out.shape, dtype=dtype)
        raw = buf.reshape(-1).view(torch.uint8).numpy()
        view = memoryview(raw).cast("B")  # type: ignore[arg-type]
        done, total = 0, (stop - start) * row_bytes
        while done < total:  # pread may return fewer bytes than asked
            got = os.preadv(self.fd, [view[done:]], first + done)
            if got <= 0:
                raise OSError(f"{self.path}: unexpected end of file reading {name}")
            done += got
        if not direct:
            out.copy_(buf)


@torch.no_grad()
def _fill(model: torch.nn.Module, sources: dict[str, tuple[Path, str]], fresh: dict[str, float]) -> None:
    """Each parameter's local rows from its (file, tensor name) (only those bytes are read), or a fresh normal
    init."""
    handles: dict[Path, SafetensorsFile] = {}
    try:
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
            if any(n != full_n for n, full_n in zip(shape[1:], param.shape[1:], strict=True)):
                raise NotImplementedError(f"{name}: shards of FSDP2 split dim 0 only, got {shape} of {param.shape}")
            file, key = sources[name]
            if file not in handles:
                handles[file] = SafetensorsFile(file)
            rows = (offset[0], offset[0] + shape[0]) if param.dim() else (0, 1)
            handles[file].read_rows(key, *rows, local)
    finally:
        for h in handles.values():
            h.close()
