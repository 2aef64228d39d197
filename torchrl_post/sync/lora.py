"""LoRA adapters on the way to the engine: PEFT's parameter names in, the merged model's HF names out.

A PEFT-wrapped model names its parameters `base_model.model.<hf name>`, and a adapted linear layer has
`<module>.base_layer.weight` (and `.bias`), `<module>.lora_A.<adapter>.weight` [r, in] and
`<module>.lora_B.<adapter>.weight` [out, r]. The engine holds the plain model, so the sync streams

    <hf module>.weight = W + scale * B @ A        (scale = lora_alpha / lora_rank, PEFT's default scaling)

and every other parameter under its HF name. An MoE model's fused experts (3-D parameters adapted by PEFT's
`target_parameters`, one nested `ParamWrapper` each) arrive as `<experts>.base_layer.base_layer.gate_up_proj`
[E, out, in] with A [r*E, in] and B [out, r*E] per wrapper, and leave as `<experts>.gate_up_proj` with each
expert's own delta added (`_merge`). The trainer's model is untouched (new tensors, never in place).
Streaming: a base weight is held only until its module's A and B arrive (PEFT registers them right after it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

PEFT_PREFIX = "base_model.model."


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def write_peft_adapter(tensors: dict[str, torch.Tensor], rank: int, alpha: int, out: Path) -> None:
    """A PEFT adapter directory (adapter_config.json, adapter_model.safetensors) from the trainer's adapter
    tensors (PEFT's in-memory names carry the adapter name, `.lora_A.default.weight`; the file format does not)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    saved = {n.replace(".default.", "."): t.contiguous() for n, t in tensors.items()}
    modules = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in saved})
    LoraConfig(r=rank, lora_alpha=alpha, target_modules=modules, task_type="CAUSAL_LM").save_pretrained(str(out))
    save_file(saved, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})


def lora_scale(rank: int, alpha: float) -> float:
    return alpha / rank


def hf_name(peft_name: str) -> str:
    """`base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight` -> `model.layers.0.self_attn.q_proj.weight`;
    `...mlp.experts.base_layer.base_layer.gate_up_proj` -> `...mlp.experts.gate_up_proj` (nested wrappers)."""
    return _BASE_LAYERS.sub(".", peft_name.removeprefix(PEFT_PREFIX))


_BASE_LAYERS = re.compile(r"(?:\.base_layer)+\.")


@dataclass
class _Layer:
    """What has arrived of one adapted module: its adapted base tensors in registration order (HF name, tensor),
    how many wrappers it has (the `.base_layer`s in a base name; 0 until a base arrives), and the A and B of each
    wrapper by depth (the `.base_layer`s before its `.lora_A.`)."""

    bases: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    wrappers: int = 0
    adapters: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    def complete(self) -> bool:
        full = [ab for ab in self.adapters.values() if len(ab) == 2]
        return self.wrappers > 0 and len(self.bases) == self.wrappers == len(full)


def merged_weights(weights: Iterable[tuple[str, torch.Tensor]], scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT name, full tensor) pairs -> (HF name, merged tensor) pairs; names without adapters pass through.

    An adapted module's base tensors are held until every adapter of it has arrived, then merged: a linear layer's
    `weight` (one wrapper), or each fused 3-D expert tensor of an MoE layer. PEFT nests one `ParamWrapper` per
    targeted parameter, the first registered innermost, so the wrapper at depth d (counted from the outside) adapts
    the (wrappers - 1 - d)-th adapted tensor in registration order (the order `named_parameters()` streams them)."""
    layers: dict[str, _Layer] = {}
    for name, tensor in weights:
        if ".lora_A." in name or ".lora_B." in name:
            kind = "A" if ".lora_A." in name else "B"
            owner = name.split(f".lora_{kind}.")[0]
            module = owner.split(".base_layer")[0]
            layer = layers.setdefault(module, _Layer())
            layer.adapters.setdefault(owner.count(".base_layer"), {})[kind] = tensor
        elif ".lora_" in name:
            raise ValueError(f"LoRA parameter {name!r} is not a lora_A/lora_B of a linear layer: not supported")
        elif ".base_layer." in name and (name.endswith(".base_layer.weight") or tensor.ndim == 3):
            module, rest = name.split(".base_layer.", 1)
            layer = layers.setdefault(module, _Layer())
            layer.wrappers = rest.count("base_layer.") + 1
            layer.bases.append((hf_name(name), tensor))
        else:
            yield hf_name(name), tensor
            continue
        if layer.complete():
            yield from _merge(layers.pop(module), scale)
    if layers:
        raise ValueError(f"LoRA layers without their base weight or both adapter matrices: {sorted(layers)[:3]}")


def _merge(layer: _Layer, scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """W + scale * delta for each base of `layer`: B @ A for a linear weight [out, in]; for fused experts
    [E, out, in] with A [r*E, in] and B [out, r*E], expert e's delta is B[:, :, e] @ A[e] with A viewed as
    [E, r, in] and B as [out, r, E] (peft/tuners/lora/layer.py ParamWrapper.get_delta_weight)."""
    for i, (name, base) in enumerate(layer.bases):
        ab = layer.adapters[layer.wrappers - 1 - i]
        a, b = ab["A"].to(torch.float32), ab["B"].to(torch.float32)
        if base.ndim == 3:
            experts = base.shape[0]
            a_eri = a.reshape(experts, -1, a.shape[-1])
            b_ore = b.reshape(b.shape[0], -1, experts)
            delta = torch.einsum("ore,eri->eoi", b_ore, a_eri)
        else:
            delta = b @ a
        if delta.shape != base.shape:
            raise ValueError(
                f"LoRA on {name}: the adapter's update {tuple(delta.shape)} does not fit {tuple(base.shape)}"
            )
        yield name, (base.to(torch.float32) + scale * delta).to(base.dtype)
