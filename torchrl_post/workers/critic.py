"""The critic: the LM backbone plus a scalar head (HF *ForTokenClassification, one label) under FSDP2.

The value of response token t is read at column P + t - 1, the state before the token is generated (the
same shift as the policy's logprobs). Clipped value loss, its own AdamW and schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification

from torchrl_post.algos.policy_loss import LossScale
from torchrl_post.algos.value_loss import clipped_value_loss
from torchrl_post.config.schema import CriticConfig, FSDPConfig, ModelConfig
from torchrl_post.distributed.placement import dp_group
from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.multimodal.vision import VisionSpec, model_inputs
from torchrl_post.types import Batch
from torchrl_post.workers.fsdp import reshard
from torchrl_post.workers.loading import fsdp_model
from torchrl_post.workers.micro_batches import chunks
from torchrl_post.workers.models import empty_model, model_dtype, params_on_meta, with_experts
from torchrl_post.workers.optim import (
    build_optimizer,
    clip_grad_norm,
    global_sum,
    load_scheduler,
    lr_schedule,
    pending_optimizer_bytes,
)
from torchrl_post.workers.packing import can_pack, packed_inputs
from torchrl_post.workers.sequence import SequenceGroup, sequence_outputs


class VisionValueModel(torch.nn.Module):
    """A vision-language model's backbone (vision tower and decoder) with a scalar head on each position:
    transformers has no token-classification class for these models. Its parameter names are the causal LM's
    (`model.visual.*`, `model.language_model.*`) but for the head (`score.weight`)."""

    def __init__(self, backbone: Any) -> None:
        super().__init__()
        self.model = backbone
        self.config = backbone.config
        hidden, dtype = self.config.text_config.hidden_size, backbone.dtype
        self.score = torch.nn.Linear(hidden, 1, bias=False, dtype=dtype)
        torch.nn.init.normal_(self.score.weight, std=self.config.text_config.initializer_range)

    @classmethod
    def load(cls, path: str, model_cfg: ModelConfig, config: Any, dtype: torch.dtype, empty: bool) -> VisionValueModel:
        """From `path`, or with its parameters on the meta device (`empty`: `loading.fsdp_model` fills them)."""
        if not empty:
            backbone = AutoModel.from_pretrained(
                path, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code, use_safetensors=True
            )
            return cls(with_experts(backbone, model_cfg))
        with params_on_meta():
            backbone = AutoModel.from_config(config, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code)
            return cls(with_experts(backbone, model_cfg))

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.model.gradient_checkpointing_enable(**kwargs)

    def forward(self, **inputs: Any) -> SimpleNamespace:
        hidden = self.model(**inputs).last_hidden_state
        return SimpleNamespace(logits=self.score(hidden))


class Critic:
    def __init__(
        self,
        model_cfg: ModelConfig,
        cfg: CriticConfig,
        mesh: DeviceMesh,
        device: torch.device,
        *,
        mini_batch_samples: int,
        micro_batch_samples: int,
        epochs: int,
        max_response_length: int,
        total_steps: int,
        fsdp: FSDPConfig | None = None,
        sequence: DeviceMesh | None = None,
        experts: DeviceMesh | None = None,
    ) -> None:
        """`mini_batch_samples` per optimizer step on this rank, `micro_batch_samples` per forward and backward of
        the update (the plan's: RolePlan.micro_batch_samples), `epochs` passes (the actor's ppo_epochs);
        `total_steps`: the run's training steps (the lr schedule's length);
        `fsdp`: the plan's FSDP settings (default critic.fsdp); `sequence`: the (dp, sp) mesh with Ulysses
        sequence parallelism (`workers/sequence.py`); `experts`: expert parallelism's (efsdp, ep) mesh."""
        self.cfg, self.device = cfg, device
        self.packed = model_cfg.use_remove_padding
        self.shared = model_cfg.use_remove_padding and model_cfg.use_shared_prefix
        self.seq = SequenceGroup.of(sequence)
        self.shard = self.seq.shard if self.seq else None
        self.sp = self.seq.size if self.seq else 1
        # sums over the batch: over the ranks with distinct rows (one per sp group)
        self.group = self.seq.dp if self.seq else dp_group(mesh)
        self.dp_size = self.seq.dp_size if self.seq else mesh.size()
        self.mini_batch_samples, self.epochs, self.max_response_length = mini_batch_samples, epochs, max_response_length
        self.micro_batch_samples = micro_batch_samples
        path = cfg.model.path or model_cfg.path
        config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
        dtype = model_dtype(model_cfg)  # the value model is kept in model.dtype too

        def build(empty: bool) -> torch.nn.Module:
            model: Any
            if VisionSpec.of(config) is not None:
                model = VisionValueModel.load(path, model_cfg, config, dtype, empty)
            elif empty:
                model = empty_model(model_cfg, config, AutoModelForTokenClassification)
            else:
                model = AutoModelForTokenClassification.from_pretrained(
                    path,
                    config=config,
                    dtype=dtype,
                    trust_remote_code=model_cfg.trust_remote_code,
                    use_safetensors=True,
                )
                model = with_experts(model, model_cfg)
            if model_cfg.enable_gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return model

        config.num_labels = 1
        config.classifier_dropout = 0.0  # a value head wants no dropout noise
        # The value head is new: normal(0, initializer_range) weights, zero bias, the same on every rank.
        head = {"score.weight": config.get_text_config().initializer_range, "score.bias": 0.0}
        # critic.fsdp.offload_policy: CPU shards, optimizer on CPU; model.load_format=sharded: each rank its rows
        self.model = fsdp_model(
            build,
            model_cfg,
            mesh,
            fsdp or cfg.fsdp,
            device,
            role="critic",
            path=path,
            fresh=head,
            experts=experts,
        )
        self.optimizer, self.scheduler = build_optimizer(
            self.model, cfg.lr, cfg.weight_decay, lr_schedule(cfg, total_steps)
        )
        self.host_shards = (fsdp or cfg.fsdp).offload_policy

    def pending_state_bytes(self) -> int:
        """As the actor's (workers/optim.py `pending_optimizer_bytes`): a colocated engine leaves it free too."""
        return pending_optimizer_bytes(self.model, self.device.type == "cpu" or self.host_shards)

    def _values(self, b: Batch, sl: slice) -> torch.Tensor:
        """V(s_t) of `sl`'s response tokens [b, R]: the value head at the position before each token."""
        if self.packed and can_pack(b):  # model.use_remove_padding: rows without padding (`pack`)
            p, inputs = packed_inputs(self.model, b, sl, self.device, self.shared, self.shard)
            return p.unpack(p.full(sequence_outputs(self.model, inputs, self.shard))[:, 0].float())
        out = sequence_outputs(self.model, model_inputs(b, sl, 0, b.input_ids.shape[1], self.device), self.shard)
        return out[:, -b.response_width - 1 : -1, 0].float()

    @torch.no_grad()
    def values(self, batch: Batch) -> torch.Tensor:
        """V(s_t) for every response token, [B, R], zero outside the loss mask, on CPU."""
        self.model.eval()
        rows, mine = self.seq.union(batch) if self.seq else (batch, None)
        micro = self.cfg.ppo_micro_batch_size_per_gpu  # a no-grad pass over the whole batch: no mini-batch bounds it
        vals = [self._values(rows, sl).cpu() for sl in chunks(len(rows), micro)]
        reshard(self.model)  # no backward follows: free what the root (and ZeRO-2 layers) kept gathered
        out = torch.cat(vals) * rows.loss_mask
        return out if mine is None else SequenceGroup.mine(out, mine, batch)

    def update(self, batch: Batch) -> dict[str, float]:
        """Clipped value regression of the values onto `batch.returns`; one optimizer step per mini-batch."""
        assert batch.values is not None and batch.returns is not None
        self.model.train()
        c = self.cfg
        if self.seq:  # the sp group trains the union of its ranks' rows, mini-batch by mini-batch
            batch = self.seq.union(batch, self.mini_batch_samples)[0]
        assert batch.values is not None and batch.returns is not None
        tokens, clipped, loss_total = 0.0, 0.0, 0.0
        norms: list[float] = []
        for _ in range(self.epochs):
            for mini in chunks(len(batch), self.mini_batch_samples * self.sp):
                mask_all = batch.train_mask[mini]
                local = torch.stack([mask_all.sum().double(), (mask_all.sum(-1) > 0).sum().double()])
                g_tokens, g_seqs = global_sum(local, self.group, self.device).tolist()
                scale = LossScale(g_tokens, g_seqs, self.max_response_length, self.dp_size)
                self.optimizer.zero_grad(set_to_none=True)
                for micro in chunks(mini.stop - mini.start, self.micro_batch_samples):
                    rows = slice(mini.start + micro.start, mini.start + micro.stop)
                    mask = mask_all[micro].to(self.device)
                    loss, clipfrac = clipped_value_loss(
                        self._values(batch, rows),
                        batch.values[rows].to(self.device),
                        batch.returns[rows].to(self.device),
                        mask,
                        c.cliprange_value,
                        c.loss_agg_mode,
                        scale,
                    )
                    loss.backward()
                    n_tok = float(mask.sum())
                    tokens, clipped, loss_total = (
                        tokens + n_tok,
                        clipped + clipfrac.item() * n_tok,
                        loss_total + loss.item(),
                    )
                grad_norm = clip_grad_norm(self.model, c.grad_clip)
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    self.optimizer.zero_grad(set_to_none=True)
                norms.append(grad_norm)
        lr = float(self.optimizer.param_groups[0]["lr"])  # what this step trained at
        self.scheduler.step()
        tot = reduce_metrics(
            {"tokens": ("sum", tokens), "clipped": ("sum", clipped), "loss": ("sum", loss_total)},
            self.group,
            self.device,
        )
        steps = max(len(norms), 1)
        return {
            "critic/loss": tot["loss"] / self.dp_size / steps,
            "critic/vf_clipfrac": tot["clipped"] / max(tot["tokens"], 1.0),
            "critic/grad_norm": sum(norms) / steps,
            "critic/lr": lr,
        }

    def start_update(self, batch: Batch) -> Callable[[], dict[str, float]]:
        """Update now; the metrics come from the returned call (a critic on its own ranks updates while
        the actor does, and its proxy answers that call when it is done)."""
        metrics = self.update(batch)
        return lambda: metrics

    def trained(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        return {"critic": (self.model, self.optimizer)}

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_scheduler(self.scheduler, state["scheduler"])
