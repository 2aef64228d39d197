"""The critic: the LM backbone plus a scalar head (HF *ForTokenClassification, one label) under FSDP2.

The value of response token t is read at column P + t - 1, the state before the token is generated (the
same shift as the policy's logprobs). Clipped value loss, its own AdamW and schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig, AutoModelForTokenClassification

from torchrl_post.algos.value_loss import clipped_value_loss
from torchrl_post.config.schema import Config
from torchrl_post.distributed.placement import dp_group
from torchrl_post.types import RolloutBatch
from torchrl_post.workers.fsdp import apply_fsdp
from torchrl_post.workers.logprobs import chunks
from torchrl_post.workers.optim import build_optimizer, clip_grad_norm, global_sum


@dataclass
class CriticBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    old_values: torch.Tensor  # [B, R], the values the advantages were computed with
    returns: torch.Tensor  # [B, R]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class Critic:
    def __init__(self, cfg: Config, mesh: DeviceMesh, device: torch.device) -> None:
        self.cfg, self.ccfg, self.device = cfg, cfg.critic, device
        self.group, self.dp_size = dp_group(mesh), mesh.size()
        path = cfg.critic.model.path or cfg.model.path
        config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
        config.num_labels = 1
        config.classifier_dropout = 0.0  # a value head wants no dropout noise
        model = AutoModelForTokenClassification.from_pretrained(
            path,
            config=config,
            dtype=torch.float32,
            trust_remote_code=cfg.model.trust_remote_code,
            use_safetensors=True,
        )
        if cfg.model.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = apply_fsdp(model, mesh, cfg.critic.fsdp)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, cfg.critic.lr, cfg.critic.weight_decay, cfg.critic.lr_warmup_steps
        )

    def _values(self, b: RolloutBatch | CriticBatch, sl: slice) -> torch.Tensor:
        width = b.response_mask.shape[1]
        out = self.model(
            input_ids=b.input_ids[sl].to(self.device),
            attention_mask=b.attention_mask[sl].to(self.device),
            position_ids=b.position_ids[sl].to(self.device),
        )
        return out.logits[:, -width - 1 : -1, 0].float()

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """V(s_t) for every response token, [B, R], zero on padding, on CPU."""
        self.model.eval()
        vals = [self._values(batch, sl).cpu() for sl in chunks(len(batch), self.ccfg.ppo_micro_batch_size_per_gpu)]
        return torch.cat(vals) * batch.response_mask

    def update(self, batch: CriticBatch, mini_size: int, epochs: int) -> dict[str, float]:
        """Clipped value regression onto the returns; one optimizer step per mini-batch."""
        self.model.train()
        c = self.ccfg
        sums = torch.zeros(3, dtype=torch.float64)  # tokens, clipped tokens, loss
        norms: list[float] = []
        for _ in range(epochs):
            for mini in chunks(len(batch), mini_size):
                mask_all = batch.response_mask[mini]
                global_tokens = float(global_sum(mask_all.sum().double(), self.group, self.device).item())
                token_norm = max(global_tokens, 1.0) / self.dp_size
                self.optimizer.zero_grad(set_to_none=True)
                for micro in chunks(mini.stop - mini.start, c.ppo_micro_batch_size_per_gpu):
                    rows = slice(mini.start + micro.start, mini.start + micro.stop)
                    mask = batch.response_mask[rows].to(self.device)
                    values = self._values(batch, rows)
                    norm = token_norm if c.loss_agg_mode == "token-mean" else None
                    loss, clipfrac = clipped_value_loss(
                        values,
                        batch.old_values[rows].to(self.device),
                        batch.returns[rows].to(self.device),
                        mask,
                        c.cliprange_value,
                        c.loss_agg_mode,
                        token_norm=norm,
                    )
                    if c.loss_agg_mode != "token-mean":
                        loss = loss * (micro.stop - micro.start) / (mini.stop - mini.start)
                    loss.backward()
                    n_tok = mask.sum().double().cpu()
                    sums += torch.stack([n_tok, clipfrac.double().cpu() * n_tok, loss.detach().double().cpu()])
                grad_norm = clip_grad_norm(self.model, c.grad_clip)
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    self.optimizer.zero_grad(set_to_none=True)
                norms.append(grad_norm)
        self.scheduler.step()
        tot = global_sum(sums, self.group, self.device)
        steps = max(len(norms), 1)
        return {
            "critic/loss": tot[2].item() / self.dp_size / steps,
            "critic/vf_clipfrac": tot[1].item() / max(tot[0].item(), 1.0),
            "critic/grad_norm": sum(norms) / steps,
            "critic/lr": float(self.scheduler.get_last_lr()[0]),
        }
