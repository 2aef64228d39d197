"""Rollout engines behind one interface (`RolloutEngine`): vllm (in-process) and hf (transformers)."""

from __future__ import annotations

import torch

from torchrl_post.config.schema import Config
from torchrl_post.rollout.base import RolloutEngine, SamplingParams, collate

__all__ = ["RolloutEngine", "SamplingParams", "build_engine", "collate"]


def build_engine(cfg: Config, device: torch.device, seed: int, pad_id: int, eos_ids: list[int]) -> RolloutEngine:
    if cfg.rollout.engine == "vllm":
        from torchrl_post.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(cfg, device, seed)
    from torchrl_post.rollout.hf_engine import HFEngine

    return HFEngine(cfg, device, pad_id, eos_ids)
