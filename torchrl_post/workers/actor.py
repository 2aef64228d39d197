"""The actor: an HF causal LM under FSDP2, its optimizer and schedule, logprobs and the PPO update."""

from __future__ import annotations

import logging
import math

import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoModelForCausalLM

from torchrl_post.algos.kl import kl_penalty
from torchrl_post.algos.policy_loss import agg_loss, gspo_loss, ppo_clip_loss, truncated_is_weights
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import uses_rollout_is
from torchrl_post.distributed.placement import dp_group
from torchrl_post.types import RolloutBatch, TrainBatch
from torchrl_post.workers.fsdp import apply_fsdp
from torchrl_post.workers.logprobs import batched_log_probs, chunks, micro_slices, padded_forward_log_probs
from torchrl_post.workers.optim import build_optimizer, clip_grad_norm, global_sum

log = logging.getLogger(__name__)


def _agg(x_bt: torch.Tensor, mask_bt: torch.Tensor, mode: str, token_norm: float, frac: float) -> torch.Tensor:
    """One micro-batch's share of the mini-batch loss: token-mean over the global mini-batch (exact across
    ranks and micro-batches); the sequence modes weighted by the micro-batch's share of the rows."""
    if mode == "token-mean":
        return agg_loss(x_bt, mask_bt, "token-mean", token_norm)
    return agg_loss(x_bt, mask_bt, mode) * frac


class Actor:
    def __init__(self, cfg: Config, mesh: DeviceMesh, device: torch.device) -> None:
        self.cfg = cfg
        self.acfg = cfg.actor
        self.mesh = mesh
        self.group = dp_group(mesh)
        # Truncated importance sampling against the rollout engine's logprobs (0: off).
        self.is_cap = cfg.algorithm.rollout_is_threshold if uses_rollout_is(cfg) else 0.0
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
        self.optimizer, self.scheduler = build_optimizer(
            self.model,
            cfg.actor.lr,
            cfg.actor.weight_decay,
            cfg.actor.lr_warmup_steps,
            (cfg.actor.betas[0], cfg.actor.betas[1]),
        )
        self.nonfinite_skips = 0
        self.consecutive_skips = 0

    def _fwd(
        self, b: RolloutBatch | TrainBatch, sl: slice, width: int, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        dev = self.device
        return padded_forward_log_probs(
            self.model,
            b.input_ids[sl].to(dev),
            b.attention_mask[sl].to(dev),
            b.position_ids[sl].to(dev),
            width,
            temperature,
        )

    @property
    def token_budget(self) -> int:
        return self.acfg.ppo_max_token_len_per_gpu if self.acfg.use_dynamic_bsz else 0

    def compute_log_probs(self, batch: RolloutBatch, temperature: float) -> torch.Tensor:
        """Logprobs of every response token under the current weights, [B, R], on CPU."""
        micro = self.acfg.ppo_micro_batch_size_per_gpu
        return batched_log_probs(self.model, batch, temperature, micro, self.device, self.token_budget)

    def _global_sum(self, t: torch.Tensor) -> torch.Tensor:
        return global_sum(t, self.group, self.device)

    def update(self, batch: TrainBatch, temperature: float, mini_size: int) -> dict[str, float]:
        """PPO epochs over mini-batches of `mini_size` local samples, micro-batched; one optimizer step each."""
        self.model.train()
        a = self.acfg
        low = a.clip_ratio if a.clip_ratio_low is None else a.clip_ratio_low
        high = a.clip_ratio if a.clip_ratio_high is None else a.clip_ratio_high
        width = batch.response_mask.shape[1]
        # Local sums, reduced across ranks once at the end: tokens, ratio, clipped, kl, entropy, logprob diff.
        sums = torch.zeros(10, dtype=torch.float64)
        padded_cells, real_cells = 0, 0.0
        pg_losses: list[float] = []
        kl_losses: list[float] = []
        grad_norms: list[float] = []
        steps = 0
        for epoch in range(a.ppo_epochs):
            for mini in chunks(len(batch), mini_size):
                mb = batch.select(mini)
                mask_all = mb.response_mask
                global_tokens = float(self._global_sum(mask_all.sum().double()).item())
                token_norm = max(global_tokens, 1.0) / self.dp_size
                self.optimizer.zero_grad(set_to_none=True)
                mb_loss, mb_kl = 0.0, 0.0
                for micro in micro_slices(mb.attention_mask, width, a.ppo_micro_batch_size_per_gpu, self.token_budget):
                    logp, ent, cells = self._fwd(mb, micro, width, temperature)
                    padded_cells += cells
                    real_cells += float(mb.attention_mask[micro].sum())
                    mask = mask_all[micro].to(self.device)
                    adv = mb.advantages[micro].to(self.device)
                    old = mb.old_log_probs[micro].to(self.device) if mb.old_log_probs is not None else logp.detach()
                    if a.policy_loss == "gspo":
                        out = gspo_loss(logp, old, adv, mask, low, high)
                    else:
                        out = ppo_clip_loss(logp, old, adv, low, high, clip_c=a.clip_ratio_c)
                    rollout_lp = mb.rollout_log_probs[micro].to(self.device)
                    is_w = truncated_is_weights(old, rollout_lp, self.is_cap) if self.is_cap else None
                    loss_bt = out.loss_bt if is_w is None else out.loss_bt * is_w
                    frac = (micro.stop - micro.start) / len(mb)
                    pg = _agg(loss_bt, mask, a.loss_agg_mode, token_norm, frac)
                    loss = (
                        pg - a.entropy_coeff * _agg(ent, mask, a.loss_agg_mode, token_norm, frac)
                        if a.entropy_coeff
                        else pg
                    )
                    kl_value = 0.0
                    if a.use_kl_loss:
                        assert mb.ref_log_probs is not None, "the trainer computes reference logprobs for the KL loss"
                        kl_bt = kl_penalty(logp, mb.ref_log_probs[micro].to(self.device), a.kl_loss_type)
                        kl_term = _agg(kl_bt, mask, a.loss_agg_mode, token_norm, frac)
                        loss = loss + a.kl_loss_coef * kl_term
                        kl_value = kl_term.item() / self.dp_size
                    loss.backward()
                    mb_loss += pg.item() / self.dp_size
                    mb_kl += kl_value
                    with torch.no_grad():
                        m = mask.double()
                        sums += torch.stack(
                            [
                                m.sum(),
                                (out.ratio_bt * m).sum(),
                                (out.clipped_bt * m).sum(),
                                (out.approx_kl_bt * m).sum(),
                                (ent * m).sum(),
                                ((logp.detach() - rollout_lp).abs() * m).sum() if epoch == 0 else m.new_zeros(()),
                                m.sum() if epoch == 0 else m.new_zeros(()),
                                (out.dual_clipped_bt * m).sum(),
                                (is_w * m).sum() if is_w is not None else m.new_zeros(()),
                                ((is_w >= self.is_cap) * m).sum() if is_w is not None else m.new_zeros(()),
                            ]
                        ).cpu()
                grad_norm = clip_grad_norm(self.model, self.acfg.grad_clip)
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
                kl_losses.append(mb_kl)
                grad_norms.append(grad_norm)
                steps += 1
        self.scheduler.step()
        tot = self._global_sum(sums)
        losses = self._global_sum(torch.tensor(pg_losses, dtype=torch.float64))
        kls = self._global_sum(torch.tensor(kl_losses, dtype=torch.float64))
        tokens = max(tot[0].item(), 1.0)
        return {
            "actor/loss": losses.mean().item() + (self.acfg.kl_loss_coef * kls.mean().item() if a.use_kl_loss else 0.0),
            "actor/pg_loss": losses.mean().item(),
            "actor/ppo_ratio_mean": tot[1].item() / tokens,
            "actor/pg_clipfrac": tot[2].item() / tokens,
            "actor/pg_clipfrac_lower": tot[7].item() / tokens,
            "actor/ppo_kl": tot[3].item() / tokens,
            "actor/entropy": tot[4].item() / tokens,
            "actor/grad_norm": sum(grad_norms) / len(grad_norms),
            "actor/lr": float(self.scheduler.get_last_lr()[0]),
            "actor/optimizer_steps": float(steps),
            "perf/padding_frac": 1.0 - real_cells / max(padded_cells, 1),
            "actor/nonfinite_skips": float(self.nonfinite_skips),
            **({"actor/kl_loss": kls.mean().item(), "actor/kl_coef": a.kl_loss_coef} if a.use_kl_loss else {}),
            **(
                {
                    "rollout_corr/is_weight_mean": tot[8].item() / tokens,
                    "rollout_corr/is_clipfrac": tot[9].item() / tokens,
                }
                if self.is_cap
                else {}
            ),
            "_trainer_rollout_logprob_diff": tot[5].item() / max(tot[6].item(), 1.0),
        }
