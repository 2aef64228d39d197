"""The reference policy: a frozen copy of the initial policy under FSDP2, giving reference logprobs for KL."""

from __future__ import annotations

import logging

import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoModelForCausalLM

from torchrl_post.config.schema import Config
from torchrl_post.types import RolloutBatch
from torchrl_post.workers.fsdp import apply_fsdp
from torchrl_post.workers.logprobs import batched_log_probs

log = logging.getLogger(__name__)


class Reference:
    def __init__(self, cfg: Config, mesh: DeviceMesh, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model.path, dtype=torch.float32, trust_remote_code=cfg.model.trust_remote_code, use_safetensors=True
        )
        model.requires_grad_(False)
        offload = cfg.reference.param_offload and device.type != "cpu"
        if cfg.reference.param_offload and not offload:
            log.warning("reference.param_offload: parameters already live in CPU memory here; ignored")
        self.model = apply_fsdp(model, mesh, cfg.actor.fsdp, offload=offload)

    def compute_log_probs(self, batch: RolloutBatch, temperature: float) -> torch.Tensor:
        """Reference logprobs of every response token, [B, R], on CPU."""
        return batched_log_probs(
            self.model, batch, temperature, self.cfg.reference.log_prob_micro_batch_size_per_gpu, self.device
        )
