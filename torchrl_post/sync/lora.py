"""LoRA adapters on the way to the engine: PEFT's parameter names in, the merged model's HF names out.

A PEFT-wrapped model names its parameters `base_model.model.<hf name>`, and a adapted linear layer has
`<module>.base_layer.weight` (and `.bias`), `<module>.lora_A.<adapter>.weight` [r, in] and
`<module>.lora_B.<adapter>.weight` [out, r]. The engine holds the plain model, so the sync streams

    <hf module>.weight = W + scale * B @ A        (scale = lora_alpha / lora_rank, PEFT's default scaling)

and every other parameter under its HF name. The trainer's model is untouched (new tensors, never in place).
Streaming: a base weight is held only until its A and B arrive (PEFT registers them right after it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

PEFT_PREFIX = "base_model.model."
LORA_SYNC_MODES = ("merged", "adapter")
"""`rollout.lora_sync`: merged weights through the engine's reload, or the adapter into the engine's own LoRA."""


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
    """`base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight` -> `model.layers.0.self_attn.q_proj.weight`."""
    name = peft_name.removeprefix(PEFT_PREFIX)
    return name.replace(".base_layer.", ".")


def merged_weights(weights: Iterable[tuple[str, torch.Tensor]], scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT name, full tensor) pairs -> (HF name, merged tensor) pairs; names without adapters pass through."""
    held: dict[str, torch.Tensor] = {}  # module -> base weight waiting for its adapter
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        if ".lora_A." in name or ".lora_B." in name:
            module, kind = (name.split(".lora_A.")[0], "A") if ".lora_A." in name else (name.split(".lora_B.")[0], "B")
            got = parts.setdefault(module, {})
            got[kind] = tensor
            if "A" in got and "B" in got and module in held:
                yield _merge(module, held.pop(module), parts.pop(module), scale)
            continue
        if name.endswith(".base_layer.weight"):
            module = name.removesuffix(".base_layer.weight")
            if module in parts and len(parts[module]) == 2:
                yield _merge(module, tensor, parts.pop(module), scale)
            else:
                held[module] = tensor
            continue
        if ".lora_" in name or ".lora_embedding" in name:
            raise ValueError(f"LoRA parameter {name!r} is not a lora_A/lora_B of a linear layer: not supported")
        yield hf_name(name), tensor
    if held or parts:
        missing = sorted(set(held) | set(parts))
        raise ValueError(f"LoRA layers without their base weight or both adapter matrices: {missing[:3]}")


def _merge(module: str, base: torch.Tensor, ab: dict[str, torch.Tensor], scale: float) -> tuple[str, torch.Tensor]:
    delta = ab["B"].to(torch.float32) @ ab["A"].to(torch.float32)
    merged = (base.to(torch.float32) + scale * delta).to(base.dtype)
    return hf_name(module) + ".weight", merged
