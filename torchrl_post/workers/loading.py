"""Weights from safetensors straight into FSDP2 shards (`model.load_format=sharded`).

The model is built with its parameters on the meta device (buffers, such as rotary frequencies, are real and
small), sharded with `apply_fsdp`, given empty local shards, and each rank then reads only its own rows of each
tensor from the safetensors files (positioned reads of its rows, no memory map): host memory per rank is about 1/ranks of the
model plus one tensor's rows, instead of every rank holding the whole model before sharding. The values equal a
plain `from_pretrained` (tested). Checkpoint names are read as transformers reads them (`checkpoint_sources`: a
Qwen2-VL checkpoint's `model.layers.*` and `visual.*` are the model's `model.language_model.*` and
`model.visual.*`). Mixture-of-experts checkpoints store each expert's matrices apart
(`mlp.experts.{e}.gate_proj.weight`), which transformers stacks into fused 3-D parameters on load
(`mlp.experts.gate_up_proj` [E, 2I, H]); FSDP2 shards those along the expert dim, so a rank reads the per-expert
tensors of its own experts only. A checkpoint whose tensors do not cover the model's parameters under those
names, or that transformers would convert in any other way, and LoRA models (PEFT builds its adapter on loaded
weights) load in full, with one log line saying so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import AutoConfig, PreTrainedModel
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import (
    Concatenate,
    MergeModulelist,
    WeightConverter,
    WeightRenaming,
    rename_source_key,
)

from torchrl_post.config.schema import FSDPConfig, ModelConfig
from torchrl_post.sync.lora import hf_name
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


@dataclass(frozen=True)
class Piece:
    """A checkpoint tensor (`key` in `file`) and the part of a parameter it fills: the whole parameter (`expert`
    None), or part `part` of expert `expert`'s slice of a fused experts parameter, the parts concatenated along the
    slice's first dim (`gate_up_proj[e]` = cat(`experts.{e}.gate_proj.weight`, `experts.{e}.up_proj.weight`))."""

    file: Path
    key: str
    expert: int | None = None
    part: int = 0


def checkpoint_sources(model_cfg: ModelConfig, path: str | Path, files: dict[str, Path]) -> dict[str, list[Piece]]:
    """The model's parameter name -> the checkpoint tensors (of `files`: name -> file) that transformers loads
    into it: one whole tensor, or for a fused experts parameter every expert's tensors.

    transformers renames keys on load (its conversion mapping: Qwen2-VL and Qwen2.5-VL checkpoints keep the
    names from before their models were split into a language model and a vision tower, `model.layers.*` and
    `visual.*`, which load as `model.language_model.layers.*` and `model.visual.*`). The same renaming is applied
    here, computed on the model class `from_pretrained` uses (`model_class`, built on the meta device); a role's
    own model shares those names (a critic's backbone is that model's `model`). Of the keys transformers converts,
    not only renames, the per-expert tensors it stacks along a new expert dim (and concatenates along dim 1:
    `_stacks_experts`, the qwen2_moe mapping that Qwen3-MoE and others share) map to their expert's slice; other
    converted keys are left out (their rows are not the file's rows). A checkpoint that holds some of a fused
    parameter's expert tensors but not all is an error naming the missing ones. The renaming functions are
    transformers 5's loading internals (pinned to 5.16-5.19 in pyproject.toml)."""
    config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    model = empty_model(model_cfg, config)
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    stackers = [c for c in converters if _stacks_experts(c)]
    meta = model.state_dict()
    whole: dict[str, list[Piece]] = {}
    experts: dict[str, list[Piece]] = {}
    patterns: dict[str, list[str]] = {}  # a fused parameter -> its converter's source patterns, in part order
    for key, file in files.items():
        name, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
        if pattern is None:
            whole[name] = [Piece(file, key)]
            continue
        converter = next((c for c in stackers if pattern in c.source_patterns), None)
        found = _expert_pattern(pattern).search(key)
        if converter is None or found is None or name not in meta:
            continue
        patterns[name] = converter.source_patterns
        part = converter.source_patterns.index(pattern)
        experts.setdefault(name, []).append(Piece(file, key, int(found.group(2)), part))
    for name, pieces in experts.items():
        _check_experts(name, pieces, meta[name].shape[0], patterns[name])
    return experts | whole


def _stacks_experts(converter: WeightConverter) -> bool:
    """`converter` stacks per-expert tensors along a new dim 0 (`MergeModulelist(dim=0)`), then, for several
    source patterns, concatenates the stacks along dim 1 (`Concatenate(dim=1)`): transformers' qwen2_moe
    mapping, so expert e's slice of the parameter is its tensors concatenated in source-pattern order."""
    ops = converter.operations
    stacks = type(ops[0]) is MergeModulelist and ops[0].dim == 0
    if len(ops) == 1:
        return stacks and len(converter.source_patterns) == 1
    return stacks and len(ops) == 2 and type(ops[1]) is Concatenate and ops[1].dim == 1


def expert_checkpoint_names(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """Each fused experts parameter of `model` (a LoRA model's too, under PEFT's name) whose checkpoint stores its
    experts apart (`_stacks_experts`) -> its per-expert checkpoint names as templates, in part order: `model.layers.0.mlp.experts.gate_up_proj` ->
    (`model.layers.0.mlp.experts.{}.gate_proj.weight`, `...{}.up_proj.weight`). Expert e's slice of the parameter
    is its parts concatenated along the slice's first dim. These are the names every engine loads a checkpoint
    by (vLLM's FusedMoE takes them one expert at a time), so the weight sync sends expert-parallel parameters so
    (`sync/weights.py`), one ep block at a time."""
    mapping = get_model_conversion_mapping(cast(PreTrainedModel, model))
    stackers = [t for t in mapping if isinstance(t, WeightConverter) and _stacks_experts(t)]
    out: dict[str, tuple[str, ...]] = {}
    for name, param in model.named_parameters():
        if param.ndim != 3:
            continue
        plain = hf_name(name)  # a LoRA model's names as the checkpoint's (PEFT's wrappers and prefix off)
        for c in stackers:
            target = next((t for t in c.target_patterns if plain.endswith("." + t)), None)
            if target is not None:
                prefix = plain[: len(plain) - len(target)]
                out[name] = tuple(prefix + source.replace("*", "{}") for source in c.source_patterns)
                break
    return out


def expert_pieces(model: torch.nn.Module) -> dict[str, tuple[str, int, int, int]]:
    """Each per-expert checkpoint name of `model`'s fused experts (`expert_checkpoint_names`) -> (the fused
    parameter, the expert, the part, the parts): the tensor is `param[expert].chunk(parts)[part]`."""
    out: dict[str, tuple[str, int, int, int]] = {}
    for name, templates in expert_checkpoint_names(model).items():
        for expert in range(model.get_parameter(name).shape[0]):
            for part, template in enumerate(templates):
                out[template.format(expert)] = (name, expert, part, len(templates))
    return out


def _expert_pattern(pattern: str) -> re.Pattern[str]:
    """A converter's source pattern (`mlp.experts.*.gate_proj.weight`) as a regex for a whole key: group 1 the
    key's prefix (`model.layers.0.`, or None), group 2 the expert."""
    return re.compile(r"^(.*\.)?" + re.escape(pattern).replace(r"\*", r"(\d+)") + "$")


def _check_experts(name: str, pieces: list[Piece], experts: int, patterns: list[str]) -> None:
    """Every expert's tensor of every source pattern is present, and no expert beyond the model's `experts`."""
    have = {(p.expert, p.part) for p in pieces}
    beyond = sorted(p.key for p in pieces if p.expert is not None and p.expert >= experts)
    if beyond:
        raise ValueError(f"{name}: the checkpoint has experts beyond the model's {experts}: {', '.join(beyond[:3])}")
    sample = pieces[0]
    found = _expert_pattern(patterns[sample.part]).search(sample.key)
    assert found is not None  # it matched when the piece was made
    prefix = found.group(1) or ""
    absent = [
        prefix + p.replace("*", str(e)) for e in range(experts) for j, p in enumerate(patterns) if (e, j) not in have
    ]
    if absent:
        raise ValueError(
            f"{name}: the checkpoint lacks {len(absent)} of its expert tensors ({', '.join(absent[:3])}"
            f"{' ...' if len(absent) > 3 else ''}); every expert's {' and '.join(patterns)} must be there"
        )


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
    experts: DeviceMesh | None = None,
) -> torch.nn.Module:
    """A role's model under FSDP2 (`apply_fsdp`), its shards read straight from the checkpoint at `path`
    (default `model.path`) when `model.load_format=sharded` allows, else loaded in full and then sharded.
    `fresh`: parameters the checkpoint does not have (a critic's value head) -> the std of their normal init,
    drawn identically on every rank from a fixed seed. `experts`: the sparse (efsdp, ep) mesh of expert
    parallelism (`apply_fsdp`): sharded, a rank reads only the rows of the experts it keeps."""
    fresh = fresh or {}
    if model_cfg.load_format == "sharded" and model_cfg.lora_rank == 0:
        model = build(True)
        files = checkpoint_files(path or model_cfg.path)
        sources = checkpoint_sources(model_cfg, path or model_cfg.path, files)
        missing = sorted(n for n, _ in model.named_parameters() if n not in sources and n not in fresh)
        if not missing:
            apply_fsdp(model, mesh, fsdp, frozen=frozen, experts=experts)
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
    return apply_fsdp(build(False), mesh, fsdp, frozen=frozen, experts=experts)


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
        if list(out.shape) != ([stop - start, *shape[1:]] if shape else []):
            raise ValueError(f"{self.path}: rows {start}:{stop} of {name} {shape} do not fit {tuple(out.shape)}")
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
def _fill(model: torch.nn.Module, sources: dict[str, list[Piece]], fresh: dict[str, float]) -> None:
    """Each parameter's local rows from its checkpoint pieces (only those bytes are read: of a fused experts
    parameter, only the tensors of this rank's experts), or a fresh normal init."""
    handles: dict[Path, SafetensorsFile] = {}

    def handle(file: Path) -> SafetensorsFile:
        if file not in handles:
            handles[file] = SafetensorsFile(file)
        return handles[file]

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
            pieces = sources[name]
            if pieces[0].expert is None:
                rows = (offset[0], offset[0] + shape[0]) if param.dim() else (0, 1)
                handle(pieces[0].file).read_rows(pieces[0].key, *rows, local)
            else:
                _fill_experts(name, local, offset[0], pieces, handle)
    finally:
        for h in handles.values():
            h.close()


def _fill_experts(
    name: str, local: torch.Tensor, first: int, pieces: list[Piece], handle: Callable[[Path], SafetensorsFile]
) -> None:
    """Experts first:first + len(local) of fused parameter `name`: each expert's slice from its pieces, stacked
    in part order along the slice's first dim."""
    filled = [0] * len(local)  # rows of each local expert's slice read so far
    for piece in sorted(pieces, key=lambda p: (p.expert, p.part)):
        assert piece.expert is not None  # a fused parameter's pieces are all per expert (checkpoint_sources)
        i = piece.expert - first
        if not 0 <= i < len(local):
            continue
        f = handle(piece.file)
        rows = f.header[piece.key]["shape"][0]
        f.read_rows(piece.key, 0, rows, local[i, filled[i] : filled[i] + rows])
        filled[i] += rows
    if any(n != local.shape[1] for n in filled):
        raise ValueError(f"{name}: its experts' tensors fill {filled} of {local.shape[1]} rows of each expert's slice")
