"""The reference policy: a frozen copy of the initial policy under FSDP2, giving reference logprobs for KL; and the
distillation teacher, the same frozen role over another checkpoint (`role="teacher"`, its `path`)."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from torchrl_post.algos.sampling_support import Truncation
from torchrl_post.config.schema import FSDPConfig, ModelConfig, ReferenceConfig
from torchrl_post.types import Batch
from torchrl_post.workers.frozen import frozen_model
from torchrl_post.workers.logprobs import Score, batched_log_probs
from torchrl_post.workers.models import load_causal_lm
from torchrl_post.workers.sequence import SequenceGroup


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
        sequence: DeviceMesh | None = None,
        replay: bool = False,
        truncation: Truncation | None = None,
        role: str = "reference",
        top_k: int = 0,
        field: str = "ref_log_probs",
        experts: DeviceMesh | None = None,
    ) -> None:
        """`fsdp`: the actor's FSDP settings (mixed precision, fsdp_size), except two: offload follows
        `reference.param_offload` alone, and every module reshards after forward (`apply_fsdp(frozen=True)`):
        a forward-only model has no backward to keep gathered parameters for. `sequence`: the (dp, sp) mesh with
        Ulysses sequence parallelism (`workers/sequence.py`); `replay`: a MoE model's routers use the batch's
        recorded experts (actor.router_replay); `truncation`: the plan's sampling_support, as the actor's: the KL
        then compares the two policies' sampling distributions, each renormalised on its own top-k / top-p set
        (the actor's alone renormalised would add -log of its kept mass to every k1 term). `role`: how loading names
        it (the teacher's checkpoint is `model_cfg.path`); `top_k`: the teacher answers its k most likely tokens at
        each position (the plan's teacher_top_k) instead of its logprob of each sampled token; `field`: the batch
        field its answer fills (the plan's teacher_field); `experts`: expert parallelism's (efsdp, ep) mesh."""
        self.cfg, self.device, self.temperature, self.replay = cfg, device, temperature, replay
        self.truncation = truncation
        self.score = Score(top_k=top_k) if top_k else None
        self.field = field
        self.seq = SequenceGroup.of(sequence)
        self.packed = model_cfg.use_remove_padding
        self.shared = model_cfg.use_remove_padding and model_cfg.use_shared_prefix
        # On a CPU mesh the policy runs but changes no placement (the shards already live in CPU memory).
        self.model = frozen_model(
            lambda empty: load_causal_lm(model_cfg, trainable=False, empty=empty),
            model_cfg,
            mesh,
            fsdp,
            device,
            role=role,
            param_offload=cfg.param_offload,
            path=model_cfg.path,
            experts=experts,
        )

    def log_probs(self, batch: Batch) -> torch.Tensor:
        """Reference logprobs of every response token, [B, R], on CPU (with `top_k`: [B, R, k, 2], `Score`)."""
        micro = self.cfg.log_prob_micro_batch_size_per_gpu
        rows, mine = self.seq.union(batch) if self.seq else (batch, None)
        out = batched_log_probs(
            self.model, rows, self.temperature, micro, self.device, packed=self.packed, shared=self.shared,
            shard=self.seq.shard if self.seq else None, replay=self.replay, truncation=self.truncation,
            score=self.score,
        )  # fmt: skip
        return out if mine is None else SequenceGroup.mine(out, mine, batch)
