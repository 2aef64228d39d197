"""Rollout engines behind one interface (`RolloutEngine`): vllm (in-process) and hf (transformers)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from torchrl_post.rollout.base import RolloutEngine, SamplingParams, collate

if TYPE_CHECKING:  # the config package imports this module for its enum sets
    from torchrl_post.config.schema import Config

__all__ = ["ENGINES", "ROLLOUT_MODES", "RolloutEngine", "SamplingParams", "build_engine", "collate"]
ENGINES = ("vllm", "hf")  # build_engine
ROLLOUT_MODES = ("sync", "async")  # rollout.mode; the off-policy look-ahead is trainer.max_off_policy_steps


def build_engine(
    cfg: Config, device: torch.device, seed: int, pad_id: int, eos_ids: list[int], *, first_sync: bool = False
) -> RolloutEngine:
    """The engine `rollout.engine` names. Its weights come from `model.path`, or, with `first_sync` (the caller
    pushes the actor's weights before any generation, as the training loop does), as `rollout.load_format` says
    (`dummy`: random until that sync)."""
    if not first_sync and cfg.rollout.load_format != "auto":
        cfg = replace(cfg, rollout=replace(cfg.rollout, load_format="auto"))
    if cfg.rollout.engine == "vllm":
        from torchrl_post.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(cfg, device, seed)
    from torchrl_post.rollout.hf_engine import HFEngine

    return HFEngine(cfg, device, pad_id, eos_ids)
