"""Config values that name something, checked against what exists before anything loads: model.target_modules
against the model's linear modules (built on the meta device), agent.tool_parser against vLLM's parsers."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

from torchrl_post.config.errors import ConfigError, one_line
from torchrl_post.config.schema import Config
from torchrl_post.workers.models import VISION_TOWER, model_class

log = logging.getLogger(__name__)


ALL_LINEAR = "all-linear"
"""PEFT's shorthand for every linear layer but the output head (matched case-insensitively, as PEFT does)."""


def _meta_model(model_config: Any, trust_remote_code: bool) -> torch.nn.Module:
    """The architecture of `model_config` by the auto class the roles build it with (`workers.models.model_class`),
    with every tensor on the meta device: no memory, no weights."""
    with torch.device("meta"):
        model: torch.nn.Module = model_class(model_config).from_config(
            model_config, trust_remote_code=trust_remote_code
        )
    return model


def check_lora_targets(cfg: Config, model_config: Any) -> None:
    """model.target_modules (model.lora_rank > 0) names linear modules of the model, matched as PEFT matches
    them (peft/tuners/tuners_utils.py check_target_module_exists): a list entry matches a module whose full
    name equals it or ends with "." + entry, and every entry must match one; a string other than all-linear is
    a regular expression full-matched against full module names. Only nn.Linear modules can be adapted (the
    weight sync merges lora_B @ lora_A into linear weights); a vision-language model's vision tower is left out
    (`workers/models.py` excludes it from the adapter). The architecture is built on the meta device from the
    config alone, so this costs no memory however large the model."""
    m = cfg.model
    targets = m.target_modules
    if isinstance(targets, str) and targets.lower() == ALL_LINEAR:
        return
    shown = targets if isinstance(targets, str) else [str(t) for t in targets]
    key = f"model.target_modules={shown!r}"
    pattern = None
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error as e:
            raise ConfigError(f"{key} is not a valid regular expression ({e}); give all-linear or a list") from e
    try:
        model = _meta_model(model_config, m.trust_remote_code)
    except Exception as e:  # an architecture that cannot be built on meta: leave the check to PEFT
        log.warning("model.target_modules not checked: cannot build %s on the meta device (%s)", m.path, one_line(e))
        return
    vision = getattr(model_config, "vision_config", None) is not None
    modules = {
        name: module for name, module in model.named_modules() if not (vision and re.fullmatch(VISION_TOWER, name))
    }
    linear = [name for name, module in modules.items() if isinstance(module, torch.nn.Linear)]  # model order
    is_linear = set(linear)
    model_type = str(getattr(model_config, "model_type", type(model).__name__))
    of = f"{model_type} (outside its vision tower)" if vision else model_type
    known = ", ".join(sorted({name.rsplit(".", 1)[-1] for name in linear}))
    fix = f"its linear modules are: {known} (or {ALL_LINEAR})"
    if pattern is not None:
        matched = [name for name in modules if pattern.fullmatch(name)]
        if not any(name in is_linear for name in matched):
            as_list = any(name == targets or name.endswith("." + targets) for name in linear)
            hint = f" (for the modules named {targets} give a list: [{targets}])" if as_list else ""
            raise ConfigError(
                f"{key}: a string is a regular expression full-matched against module names, and this one matches "
                f"no linear module of {of} (such as {linear[0] if linear else 'none'}){hint}; {fix}"
            )
    else:
        matched = []
        for entry in shown:
            hits = [name for name in modules if name == entry or name.endswith("." + entry)]
            if not any(name in is_linear for name in hits):
                raise ConfigError(f"{key}: no linear module of {of} is named {entry}; {fix}")
            matched += hits
    other = next((name for name in matched if name not in is_linear), None)
    if other is not None:
        raise ConfigError(
            f"{key} matches {other or '(the whole model)'} ({type(modules[other]).__name__}), not a linear module: "
            f"LoRA here adapts nn.Linear modules only; {fix}"
        )


def check_tool_parser(cfg: Config) -> None:
    """With agent.env set, agent.tool_parser is one of vLLM's tool parsers (the agent loop reads the model's
    tool calls with it). vLLM is imported here, lazily, through engines/vllm.py (its only importer)."""
    a = cfg.agent
    if a.env is None:
        return
    try:
        from torchrl_post.engines.vllm import tool_parser_names

        names = tool_parser_names()
    except ImportError as e:
        if not a.tools:
            return  # nothing parses tool calls without agent.tools
        raise ConfigError(
            f"agent.tool_parser={a.tool_parser!r}: vLLM's tool parsers cannot be imported ({one_line(e)}); "
            "agent.tools needs vllm installed"
        ) from e
    if a.tool_parser not in names:
        raise ConfigError(f"agent.tool_parser={a.tool_parser!r} is not one of vLLM's tool parsers: {', '.join(names)}")
