"""The actor: an HF causal LM under FSDP2, its optimizer and schedule, logprobs and the PPO update."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from torchrl_post.algos.policy_loss import agg_loss, ppo_clip_loss
from torchrl_post.config.schema import Config
from torchrl_post.types import RolloutBatch, TrainBatch
from torchrl_post.workers.fsdp import apply_fsdp
from torchrl_post.workers.logprobs import response_log_probs

log = logging.getLogger(__name__)


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


class Actor:
    def __init__(self, cfg: Config, mesh: DeviceMesh, device: torch.device) -> None:
        self.cfg = cfg
        self.acfg = cfg.actor
        self.mesh = mesh
        self.group = mesh.get_group()
        self.dp_size = mesh.size()
        self.device = device
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model.path,
            dtype=torch.float32,
            trust_remote_code=cfg.model.trust_remote_code,
            use_safetensors=True,  # never unpickle weights
        )
        if cfg.model.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        self.model = apply_fsdp(model, mesh, cfg.actor.fsdp)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.actor.lr,
            betas=(cfg.actor.betas[0], cfg.actor.betas[1]),
            weight_decay=cfg.actor.weight_decay,
        )
        warmup = cfg.actor.lr_warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        )
        self.nonfinite_skips = 0
        self.consecutive_skips = 0

    def _fwd(
        self, b: RolloutBatch | TrainBatch, sl: slice, width: int, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.device
        return response_log_probs(
            self.model,
            b.input_ids[sl].to(dev),
            b.attention_mask[sl].to(dev),
            b.position_ids[sl].to(dev),
            width,
            temperature,
        )

    @torch.no_grad()
    def compute_log_probs(self, batch: RolloutBatch, temperature: float) -> torch.Tensor:
        """Logprobs of every response token under the current weights, [B, R], on CPU."""
        self.model.eval()
        width = batch.response_mask.shape[1]
        outs = [
            self._fwd(batch, sl, width, temperature)[0].cpu()
            for sl in _chunks(len(batch), self.acfg.ppo_micro_batch_size_per_gpu)
        ]
        return torch.cat(outs)

    def _global_sum(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.device)
        dist.all_reduce(t, group=self.group)
        return t.cpu()

    def update(self, batch: TrainBatch, temperature: float, mini_size: int) -> dict[str, float]:
        """PPO epochs over mini-batches of `mini_size` local samples, micro-batched; one optimizer step each."""
        self.model.train()
        a = self.acfg
        low = a.clip_ratio if a.clip_ratio_low is None else a.clip_ratio_low
        high = a.clip_ratio if a.clip_ratio_high is None else a.clip_ratio_high
        width = batch.response_mask.shape[1]
        # Local sums, reduced across ranks once at the end: tokens, ratio, clipped, kl, entropy, logprob diff.
        sums = torch.zeros(7, dtype=torch.float64)
        pg_losses, grad_norms, steps = [], [], 0
        for epoch in range(a.ppo_epochs):
            for mini in _chunks(len(batch), mini_size):
                mb = batch.select(mini)
                mask_all = mb.response_mask
                global_tokens = float(self._global_sum(mask_all.sum().double()).item())
                token_norm = max(global_tokens, 1.0) / self.dp_size
                self.optimizer.zero_grad(set_to_none=True)
                mb_loss = 0.0
                for micro in _chunks(len(mb), a.ppo_micro_batch_size_per_gpu):
                    logp, ent = self._fwd(mb, micro, width, temperature)
                    mask = mask_all[micro].to(self.device)
                    adv = mb.advantages[micro].to(self.device)
                    old = mb.old_log_probs[micro].to(self.device) if mb.old_log_probs is not None else logp.detach()
                    out = ppo_clip_loss(logp, old, adv, low, high)
                    if a.loss_agg_mode == "token-mean":
                        pg = agg_loss(out.loss_bt, mask, "token-mean", token_norm)
                        ent_term = agg_loss(ent, mask, "token-mean", token_norm)
                    else:
                        scale = (micro.stop - micro.start) / len(mb)
                        pg = agg_loss(out.loss_bt, mask, a.loss_agg_mode) * scale
                        ent_term = agg_loss(ent, mask, a.loss_agg_mode) * scale
                    loss = pg - a.entropy_coeff * ent_term if a.entropy_coeff else pg
                    loss.backward()
                    mb_loss += pg.item() / self.dp_size
                    with torch.no_grad():
                        m = mask.double()
                        sums += torch.stack(
                            [
                                m.sum(),
                                (out.ratio_bt * m).sum(),
                                (out.clipped_bt * m).sum(),
                                (out.approx_kl_bt * m).sum(),
                                (ent * m).sum(),
                                ((logp.detach() - mb.rollout_log_probs[micro].to(self.device)).abs() * m).sum()
                                if epoch == 0
                                else m.new_zeros(()),
                                m.sum() if epoch == 0 else m.new_zeros(()),
                            ]
                        ).cpu()
                grad_norm = self._clip_grads()
                # A NaN/inf loss gives a non-finite gradient norm too: one check covers both.
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                    self.consecutive_skips = 0
                else:
                    self.nonfinite_skips += 1
                    self.consecutive_skips += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    log.warning("non-finite loss or gradient norm: update skipped (%d so far)", self.nonfinite_skips)
                pg_losses.append(mb_loss)
                grad_norms.append(grad_norm)
                steps += 1
        self.scheduler.step()
        tot = self._global_sum(sums)
        losses = self._global_sum(torch.tensor(pg_losses, dtype=torch.float64))
        tokens = max(tot[0].item(), 1.0)
        return {
            "actor/loss": losses.mean().item(),
            "actor/pg_loss": losses.mean().item(),
            "actor/ppo_ratio_mean": tot[1].item() / tokens,
            "actor/pg_clipfrac": tot[2].item() / tokens,
            "actor/ppo_kl": tot[3].item() / tokens,
            "actor/entropy": tot[4].item() / tokens,
            "actor/grad_norm": sum(grad_norms) / len(grad_norms),
            "actor/lr": float(self.scheduler.get_last_lr()[0]),
            "actor/optimizer_steps": float(steps),
            "actor/nonfinite_skips": float(self.nonfinite_skips),
            "_trainer_rollout_logprob_diff": tot[5].item() / max(tot[6].item(), 1.0),
        }

    def _clip_grads(self) -> float:
        max_norm = self.acfg.grad_clip if self.acfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm.item())
