"""The reference policy: a frozen copy of the initial policy under FSDP2, giving reference logprobs for KL."""

from __future__ import annotations

import logging

import torch
from torch.distributed.device_mesh import DeviceMesh

from torchrl_post.config.schema import FSDPConfig, ModelConfig, ReferenceConfig
from torchrl_post.types import Batch
from torchrl_post.workers.fsdp import apply_fsdp, load_causal_lm
from torchrl_post.workers.logprobs import batched_log_probs

log = logging.getLogger(__name__)


class Reference:
    def __init__(
        self,
        model_cfg: ModelConfig,
        cfg: ReferenceConfig,
        fsdp: FSDPConfig,
        mesh: DeviceMesh,
        device: torch.device,
        *,
        temperature: float,
    ) -> None:
        self.cfg, self.device, self.temperature = cfg, device, temperature
        model = load_causal_lm(model_cfg, trainable=False)
        offload = cfg.param_offload and device.type != "cpu"
        if cfg.param_offload and not offload:
            log.warning("reference.param_offload: parameters already live in CPU memory here; ignored")
        self.model = apply_fsdp(model, mesh, fsdp, offload=offload)

    def log_probs(self, batch: Batch) -> torch.Tensor:
        """Reference logprobs of every response token, [B, R], on CPU."""
        micro = self.cfg.log_prob_micro_batch_size_per_gpu
        return batched_log_probs(self.model, batch, self.temperature, micro, self.device)
