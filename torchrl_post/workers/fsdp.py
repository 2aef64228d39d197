"""Models for the trained and frozen roles: load an HF model from disk, then FSDP2 (each decoder layer, then
the root) over a role's mesh."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, PreTrainedModel

from torchrl_post.config.schema import FSDPConfig, ModelConfig


def model_class(config: Any) -> Any:
    """The HF auto class for a model config: image-text-to-text for a vision-language model, else causal LM."""
    return AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM


def load_pretrained(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> Any:
    """`model.path` from safetensors (never unpickled) in `dtype`, by its auto class (`model_class`)."""
    config = AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)
    return model_class(config).from_pretrained(
        cfg.path, dtype=dtype, trust_remote_code=cfg.trust_remote_code, use_safetensors=True
    )


def load_causal_lm(cfg: ModelConfig, trainable: bool = True) -> Any:
    """The policy in float32, with activation checkpointing and a LoRA adapter (`model.lora_rank` > 0) if
    asked; `trainable=False`: frozen, never adapted."""
    model = load_pretrained(cfg)
    if not trainable:
        model.requires_grad_(False)
        return model
    if cfg.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora_rank > 0:
        return with_lora(model, cfg)
    return model


VISION_TOWER = r".*\.visual\..*"
"""The modules of a Qwen-VL vision tower (PEFT `exclude_modules`)."""


def with_lora(model: PreTrainedModel, cfg: ModelConfig) -> Any:
    """The model with a PEFT LoRA adapter: only the adapter's parameters require grad. A vision-language
    model's adapter covers its language model only (the vision tower stays frozen): vLLM's LoRA does not reach
    the vision encoder, so an adapter there would be lost in `rollout.lora_sync=adapter`."""
    from peft import LoraConfig, get_peft_model

    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        target_modules=targets,
        exclude_modules=VISION_TOWER if getattr(model.config, "vision_config", None) is not None else None,
        lora_dropout=cfg.lora_dropout,
        task_type="CAUSAL_LM",
    )
    if cfg.enable_gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input with a frozen embedding
    return get_peft_model(model, lora)


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


def apply_fsdp(model: torch.nn.Module, mesh: DeviceMesh, cfg: FSDPConfig, offload: bool = False) -> torch.nn.Module:
    """Shard per decoder layer and at the root; parameters become DTensors on the mesh's device.

    `offload` keeps the sharded parameters in CPU memory between uses (FSDP2 CPUOffloadPolicy; for frozen
    models on an accelerator).
    """
    mp = MixedPrecisionPolicy(
        param_dtype=getattr(torch, cfg.param_dtype), reduce_dtype=getattr(torch, cfg.reduce_dtype)
    )
    extra: dict[str, Any] = {"offload_policy": CPUOffloadPolicy()} if offload else {}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=cfg.reshard_after_forward, **extra)
    # The root keeps its parameters (embeddings, final norm, lm_head) gathered after forward: backward needs
    # them right away.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False, **extra)
    return model
