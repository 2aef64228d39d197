"""The engines behind one interface (`RolloutEngine`): vllm (in-process) and hf (transformers); `build_engine`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from torchrl_post.engines.base import EngineSpec, RolloutEngine

if TYPE_CHECKING:
    from torchrl_post.config.schema import ModelConfig, RolloutConfig


def build_engine(
    model: ModelConfig,
    rollout: RolloutConfig,
    spec: EngineSpec,
    device: torch.device,
    seed: int,
    pad_id: int,
    eos_ids: list[int],
    reserve_bytes: int = 0,
) -> RolloutEngine:
    """The engine `rollout.engine` names, with its weights as `spec.load_format` says (`dummy`: random until
    the caller's first sync; see `plan.RunPlan.engine_spec`); `reserve_bytes`: GPU memory vLLM must leave to a
    colocated trainer beyond what it holds when the engine starts."""
    if rollout.engine == "vllm":
        from torchrl_post.engines.vllm import VLLMEngine

        return VLLMEngine(model, rollout, spec, device, seed, reserve_bytes)
    from torchrl_post.engines.hf import HFEngine

    return HFEngine(model, rollout, spec, device, pad_id, eos_ids)
