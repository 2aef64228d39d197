"""Models for the trained and frozen roles: load an HF model from disk, then FSDP2 (each decoder layer, then
the root) over a role's mesh."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
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


def model_dtype(cfg: ModelConfig) -> torch.dtype:
    """`model.dtype` as a torch dtype: what the trained and frozen models are loaded and kept in."""
    dtype = getattr(torch, cfg.dtype)
    assert isinstance(dtype, torch.dtype), cfg.dtype  # validate.py admits float32, bfloat16, float16 only
    return dtype


def empty_model(cfg: ModelConfig, config: Any = None, auto: Any = None) -> Any:
    """The model of `config` (default `model.path`'s) by `auto` (default `model_class`) in `model.dtype`, with
    its parameters on the meta device (`workers/loading.py` fills them shard by shard)."""
    from torchrl_post.workers.loading import params_on_meta

    config = config or AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)
    with params_on_meta():
        return (auto or model_class(config)).from_config(
            config, dtype=model_dtype(cfg), trust_remote_code=cfg.trust_remote_code
        )


def load_causal_lm(cfg: ModelConfig, trainable: bool = True, *, empty: bool = False) -> Any:
    """The policy in `model.dtype`, with activation checkpointing and a LoRA adapter (`model.lora_rank` > 0)
    if asked; `trainable=False`: frozen, never adapted. `empty`: parameters on the meta device (`empty_model`)."""
    model = empty_model(cfg) if empty else load_pretrained(cfg, model_dtype(cfg))
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


def apply_fsdp(model: torch.nn.Module, mesh: DeviceMesh, cfg: FSDPConfig, *, frozen: bool = False) -> torch.nn.Module:
    """Shard per decoder layer and at the root; parameters become DTensors on the mesh's device.

    `cfg.offload_policy` puts FSDP2's CPUOffloadPolicy on every `fully_shard` call: the sharded parameters,
    their gradients and so the optimizer state live in CPU memory (pinned on an accelerator), each layer is
    copied to the device for its all-gather, and the optimizer steps on CPU. On a CPU mesh it changes no
    placement. `frozen`: a forward-only model (the reference): every module, the root too, reshards after
    forward whatever `cfg.reshard_after_forward` says, since no backward follows to reuse gathered parameters
    (a no-grad forward never reshards a module that keeps them).
    """
    mp = MixedPrecisionPolicy(
        param_dtype=getattr(torch, cfg.param_dtype), reduce_dtype=getattr(torch, cfg.reduce_dtype)
    )
    extra: dict[str, Any] = {}
    if cfg.offload_policy:
        extra["offload_policy"] = CPUOffloadPolicy(pin_memory=mesh.device_type != "cpu")
    layer_reshard = frozen or cfg.reshard_after_forward
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
