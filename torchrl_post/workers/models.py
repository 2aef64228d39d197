"""A role's HF model built from model.*: its class, pretrained or empty (parameters on the meta device), its
experts' implementation (model.experts_implementation), with a LoRA adapter where model.lora_rank > 0."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, PreTrainedModel

from torchrl_post.config.schema import ModelConfig
from torchrl_post.workers.moe import expert_count

VISION_TOWER = r".*\.visual\..*"
"""The modules of a Qwen-VL vision tower (PEFT `exclude_modules`)."""

log = logging.getLogger(__name__)


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


def model_class(config: Any) -> Any:
    """The HF auto class for a model config: image-text-to-text for a vision-language model, else causal LM."""
    return AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM


def load_pretrained(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> Any:
    """`model.path` from safetensors (never unpickled) in `dtype`, by its auto class (`model_class`)."""
    config = AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)
    model = model_class(config).from_pretrained(
        cfg.path, dtype=dtype, trust_remote_code=cfg.trust_remote_code, use_safetensors=True
    )
    return with_experts(model, cfg)


def model_dtype(cfg: ModelConfig) -> torch.dtype:
    """`model.dtype` as a torch dtype: what the trained and frozen models are loaded and kept in."""
    dtype = getattr(torch, cfg.dtype)
    assert isinstance(dtype, torch.dtype), cfg.dtype  # validate.py admits float32, bfloat16, float16 only
    return dtype


def empty_model(cfg: ModelConfig, config: Any = None, auto: Any = None) -> Any:
    """The model of `config` (default `model.path`'s) by `auto` (default `model_class`) in `model.dtype`, with
    its parameters on the meta device (`workers/loading.py` fills them shard by shard)."""
    config = config or AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)
    with params_on_meta():
        model = (auto or model_class(config)).from_config(
            config, dtype=model_dtype(cfg), trust_remote_code=cfg.trust_remote_code
        )
    return with_experts(model, cfg)


def with_experts(model: PreTrainedModel, cfg: ModelConfig) -> Any:
    """The model with its mixture-of-experts layers run by `model.experts_implementation` (transformers'
    `set_experts_implementation`: it sets `config._experts_implementation`, which each experts module reads at
    every forward); `auto` keeps transformers' choice. A model without such layers is returned as it is, with a
    warning if a choice was asked (transformers would refuse grouped_mm for it)."""
    choice = cfg.experts_implementation
    if choice == "auto":
        return model
    # transformers' own test for "has experts modules it can dispatch" (the @use_experts_implementation decorator)
    if not type(model)._can_set_experts_implementation():
        log.warning(f"model.experts_implementation={choice} ignored: {type(model).__name__} has no experts layers")
        return model
    model.set_experts_implementation(choice)
    return model


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


def expert_parameters(model: torch.nn.Module) -> list[str]:
    """PEFT `target_parameters` for the fused experts of an MoE model: the 3-D parameters under `.mlp.experts.`
    (transformers 5.x: `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]), as `mlp.experts.<name>`, in model order.

    The merged sync (`sync/lora.py`) adds each expert's delta in the [E, out, in] layout; experts stored
    transposed ([E, in, out], `is_transposed`: gpt-oss) are refused, as their square matrices would be ambiguous."""
    targets: list[str] = []
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        if param.ndim != 3 or ".mlp.experts." not in name:
            continue
        owner = name.rpartition(".")[0]
        if getattr(modules[owner], "is_transposed", False):
            raise ValueError(f"LoRA on {owner}: its experts are stored transposed, which the merged sync does not add")
        target = name[name.index("mlp.experts.") :]
        if target not in targets:
            targets.append(target)
    return targets


def moe_linear_targets(model: PreTrainedModel, target_modules: Any) -> Any:
    """`model.target_modules` for an MoE model: all-linear spelled out as the full names of its linear modules,
    but the output head, a vision tower and the gating linears beside the experts (a router `gate`,
    `shared_expert_gate`): left to PEFT, all-linear would adapt the router (PEFT 0.21 maps transformers v4's
    linear `gate` onto the v5 router's weight). A list or a regular expression is PEFT's to match."""
    if not (isinstance(target_modules, str) and target_modules.lower() == "all-linear"):
        return target_modules
    head = model.get_output_embeddings()
    moe_blocks = {name.removesuffix(".experts") for name, _ in model.named_modules() if name.endswith(".experts")}
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and module is not head
        and not re.fullmatch(VISION_TOWER, name)
        and name.rpartition(".")[0] not in moe_blocks
    ]


def with_lora(model: PreTrainedModel, cfg: ModelConfig) -> Any:
    """The model with a PEFT LoRA adapter: only the adapter's parameters require grad. A vision-language
    model's adapter covers its language model only (the vision tower stays frozen): vLLM's LoRA does not reach
    the vision encoder, so an adapter there would be lost in `rollout.lora_sync=adapter`. An MoE model's adapter
    also covers its fused experts (`expert_parameters`), never its router (`moe_linear_targets`)."""
    from peft import LoraConfig, get_peft_model

    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    experts = expert_parameters(model) if expert_count(model.config) else []
    if experts:
        targets = moe_linear_targets(model, targets)
    vision = getattr(model.config, "vision_config", None) is not None
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        target_modules=targets,
        target_parameters=experts or None,
        exclude_modules=VISION_TOWER if vision else None,
        lora_dropout=cfg.lora_dropout,
        task_type="CAUSAL_LM",
    )
    if cfg.enable_gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input with a frozen embedding
    return get_peft_model(model, lora)
