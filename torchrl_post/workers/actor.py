"""The actor: an HF causal LM under FSDP2, its optimizer and schedule, logprobs and the PPO update."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from torchrl_post.algos.advantages import informative_rows
from torchrl_post.algos.distill import (
    distillation_advantages,
    distillation_weight,
    forward_kl_topk,
    reverse_kl_estimate,
)
from torchrl_post.algos.kl import kl_penalty
from torchrl_post.algos.policy_loss import (
    LossScale,
    agg_loss,
    nll_loss,
    policy_loss,
    selection_generator,
)
from torchrl_post.algos.rollout_correction import (
    STAT_MAXES,
    STAT_SUMS,
    Corrected,
    RolloutCorrection,
    correct,
    correction_metrics,
)
from torchrl_post.algos.sampling_support import Truncation
from torchrl_post.config.schema import ActorConfig, DistillationConfig, FSDPConfig, ModelConfig
from torchrl_post.distributed.placement import dp_group
from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.types import Batch
from torchrl_post.workers.flops import ModelFlops, causal_pairs, peak_tflops, shared_pairs, training_flops
from torchrl_post.workers.fsdp import reshard
from torchrl_post.workers.loading import fsdp_model
from torchrl_post.workers.logprobs import MoeForward, Score, batched_log_probs, forward_log_probs
from torchrl_post.workers.micro_batches import chunks, plan_micro_batches
from torchrl_post.workers.models import load_causal_lm
from torchrl_post.workers.moe import RouteTrace, routers
from torchrl_post.workers.optim import (
    build_optimizer,
    clip_grad_norm,
    global_sum,
    load_scheduler,
    lr_schedule,
    move_optimizer_state,
    pending_optimizer_bytes,
)
from torchrl_post.workers.packing import can_pack
from torchrl_post.workers.sequence import SequenceGroup

log = logging.getLogger(__name__)

SUMS = (
    "tokens", "ratio", "clipped", "dual_clipped", "kl", "entropy", "diff", "diff_tokens", "pg", "kl_loss",
    "moe_aux", "route_differ", "route_decisions", "distill", "student_mass", "teacher_mass",
)  # fmt: skip
"""The update's running sums (token-weighted metrics; the policy and KL loss terms; a MoE model's load-balancing
loss and routing decisions that differ from the engine's; the distillation estimate), in the order accumulated; the rollout correction's
follow (`STAT_SUMS`, then its maxima `STAT_MAXES`)."""


RATIO_METRICS = (
    "actor/ppo_ratio_mean",
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "rollout/logprob_diff",
)
"""The update's metrics of the policy ratio and the engine's logprobs, which a supervised update does not report."""


class Actor:
    def __init__(
        self,
        model_cfg: ModelConfig,
        cfg: ActorConfig,
        mesh: DeviceMesh,
        device: torch.device,
        *,
        temperature: float,
        mini_batch_samples: int,
        micro_batch_samples: int,
        max_response_length: int,
        total_steps: int,
        correction: RolloutCorrection | None = None,
        fsdp: FSDPConfig | None = None,
        sequence: DeviceMesh | None = None,
        replay: bool = False,
        truncation: Truncation | None = None,
        skip_zero_advantage: bool = False,
        seed: int = 0,
        supervised: bool = False,
        distill: DistillationConfig | None = None,
        experts: DeviceMesh | None = None,
    ) -> None:
        """`mini_batch_samples`: samples per optimizer step on this rank; `micro_batch_samples`: per forward and
        backward of the update (the plan's: RolePlan.micro_batch_samples); `total_steps`: the run's training steps
        (one lr-schedule step each: the cosine decays over them); `correction`: the plan's importance weights and
        rejection against the rollout engine's logprobs (default none); `fsdp`: the plan's FSDP
        settings (default actor.fsdp, `auto` dtypes resolved by the mesh's device); `sequence`: the (dp, sp) mesh
        with Ulysses sequence parallelism (`workers/sequence.py`); `replay`: a MoE model's routers use the batch's
        recorded experts (the plan's router_replay); `truncation`: the old and the update's logprobs renormalised
        on the sampler's top-k / top-p set (the plan's sampling_support), as the rollout logprobs are;
        `skip_zero_advantage`: the update skips the rows whose trained tokens all have advantage 0 (the plan's);
        `seed`: trainer.seed, with the update and micro-batch index the seed of clip_cov's random token draw;
        `supervised`: the loss is the trained tokens' negative log-likelihood (the plan's sft); `distill`: on-policy
        distillation's term against the batch's teacher_log_probs (distillation.*, where the plan has a teacher);
        `experts`: the sparse (efsdp, ep) mesh of expert parallelism (the plan's expert_parallel, `apply_fsdp`)."""
        self.cfg, self.mesh, self.device = cfg, mesh, device
        fsdp = fsdp or cfg.fsdp
        # Host offload between phases only where there is an accelerator to free (and FSDP's own CPU offload
        # does not keep the shards on the host already).
        self.host_shards = fsdp.offload_policy  # FSDP's own CPU offload: shards and optimizer state live on the host
        on_gpu = device.type != "cpu" and not fsdp.offload_policy
        self.param_offload, self.optimizer_offload = on_gpu and fsdp.param_offload, on_gpu and fsdp.optimizer_offload
        self.offloaded = False
        self.seq = SequenceGroup.of(sequence)
        self.shard = self.seq.shard if self.seq else None
        # sums over the batch: over the ranks with distinct rows (one per sp group)
        self.group = self.seq.dp if self.seq else dp_group(mesh)
        self.dp_size = self.seq.dp_size if self.seq else mesh.size()
        self.sp = self.seq.size if self.seq else 1
        self.temperature, self.mini_batch_samples = temperature, mini_batch_samples
        self.micro_batch_samples = micro_batch_samples
        self.max_response_length = max_response_length
        self.correction = correction or RolloutCorrection()
        self.truncation = truncation
        self.skip_zero_advantage = skip_zero_advantage
        self.seed = seed
        self.supervised = supervised
        self.distill = distill
        self.vanilla = replace(cfg, policy_loss="vanilla")  # the distillation term's PPO loss, the actor's clip
        self.packed = model_cfg.use_remove_padding
        self.shared = model_cfg.use_remove_padding and model_cfg.use_shared_prefix
        if model_cfg.dtype != "float32" and model_cfg.lora_rank == 0:
            d = model_cfg.dtype
            log.warning(
                f"model.dtype={d}: AdamW steps {d} master weights, which drop updates below their rounding step; "
                f"model.dtype=float32 with actor.fsdp.param_dtype={d} computes in {d} and keeps them"
            )

        def build(empty: bool) -> torch.nn.Module:
            model = load_causal_lm(model_cfg, empty=empty)
            model.config.use_cache = False
            return model

        # actor.fsdp.offload_policy: CPU shards, optimizer on CPU; model.load_format=sharded: each rank reads its rows
        self.model = fsdp_model(build, model_cfg, mesh, fsdp, device, role="actor", experts=experts)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, cfg.lr, cfg.weight_decay, lr_schedule(cfg, total_steps), (cfg.betas[0], cfg.betas[1])
        )
        self.nonfinite_skips = 0
        self.consecutive_skips = 0
        # mixture-of-experts: the routers' load-balancing loss and their routing against the engine's record
        self.moe = bool(routers(self.model))
        self.replay = replay and self.moe
        self.flops = ModelFlops.of(self.model)
        self.peak_tflops = peak_tflops(device, getattr(torch, fsdp.param_dtype, torch.float32))

    @property
    def token_budget(self) -> int:
        """Tokens per micro-batch of rows (a rank holds 1/sp of them)."""
        return self.cfg.ppo_max_token_len_per_gpu * self.sp if self.cfg.use_dynamic_bsz else 0

    def pending_state_bytes(self) -> int:
        """Accelerator bytes this rank's optimizer state will take at the first step (AdamW's two moments in the
        parameters' dtype), 0 where it lives on the host: what a colocated engine must leave free."""
        on_host = self.device.type == "cpu" or self.optimizer_offload or self.host_shards
        return pending_optimizer_bytes(self.model, on_host)

    def offload(self) -> None:
        """Hybrid engine: before the engine generates (after the weight sync, a checkpoint), the sharded
        parameters (actor.fsdp.param_offload) and the optimizer state (optimizer_offload) go to host memory;
        `onload` brings them back before the next forward or checkpoint. The gradients are already freed
        (`update`)."""
        if self.offloaded:
            return
        if self.param_offload:
            self.model.to("cpu")  # FSDP2 re-points its sharded parameters after a module move
        if self.optimizer_offload:
            move_optimizer_state(self.optimizer, torch.device("cpu"))
        if self.param_offload or self.optimizer_offload:
            self.offloaded = True
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if not self.offloaded:
            return
        if self.param_offload:
            self.model.to(self.device)
        if self.optimizer_offload:
            move_optimizer_state(self.optimizer, self.device)
        self.offloaded = False

    def log_probs(self, batch: Batch) -> torch.Tensor:
        """Logprobs of every response token under the current weights, [B, R], on CPU."""
        self.onload()
        micro = self.cfg.ppo_micro_batch_size_per_gpu  # a no-grad pass over the whole batch: no mini-batch bounds it
        rows, mine = self.seq.union(batch) if self.seq else (batch, None)
        out = batched_log_probs(
            self.model, rows, self.temperature, micro, self.device, self.token_budget, self.packed, self.group,
            self.shared, self.shard, self.replay, self.truncation,
        )  # fmt: skip
        reshard(self.model)  # no backward follows: free what the root (and ZeRO-2 layers) kept gathered
        return out if mine is None else SequenceGroup.mine(out, mine, batch)

    def base_log_probs(self, batch: Batch) -> torch.Tensor:
        """Logprobs under the base model: a LoRA actor with its adapter disabled (the reference policy)."""
        with self.model.disable_adapter():  # type: ignore[operator]  # a PEFT model's context manager
            return self.log_probs(batch)

    def _scale(self, mask_bt: torch.Tensor) -> LossScale:
        """The mini-batch's denominators over every rank (one all_reduce)."""
        local = torch.stack([mask_bt.sum().double(), (mask_bt.sum(-1) > 0).sum().double()])
        tokens, seqs = global_sum(local, self.group, self.device).tolist()
        return LossScale(tokens, seqs, self.max_response_length, self.dp_size)

    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over mini-batches, micro-batched; one optimizer step per mini-batch."""
        assert batch.advantages is not None
        self.onload()
        self.model.train()
        a = self.cfg
        mini_samples = self.mini_batch_samples * self.sp
        if self.seq:  # the sp group trains the union of its ranks' rows, mini-batch by mini-batch
            batch = self.seq.union(batch, self.mini_batch_samples)[0]
        packed = self.packed and can_pack(batch)
        # Running sums stay on the device (no host sync per micro-batch); read once after the last step.
        acc = torch.zeros(len(SUMS), dtype=torch.float64, device=self.device)
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        corr = self.correction
        corr_sums = torch.zeros(len(STAT_SUMS), dtype=torch.float64, device=self.device)
        corr_maxes = torch.full((len(STAT_MAXES),), -math.inf, dtype=torch.float64, device=self.device)
        padded_cells, placed_cells, real_cells = 0, 0, 0.0
        work = [0.0, 0.0, 0.0]  # the live rows' response tokens, causal pairs and count (`flops`)
        started = time.perf_counter()
        rows_seen, rows_skipped = 0, 0
        grad_norms: list[float] = []
        # clip_cov's draws: one generator per micro-batch, keyed by the update (the schedule's count, restored on
        # resume) and the dp coordinate (an sp group's ranks compute one loss and must draw alike)
        update_index, dp_rank, micro_index = self.scheduler.last_epoch, dist.get_rank(self.group), 0
        for epoch in range(a.ppo_epochs):
            for mini in chunks(len(batch), mini_samples):
                mb = batch.select(mini)
                mask_all = mb.train_mask
                # The rollout correction of the whole mini-batch where its old logprobs are known before the update
                # (always when it rejects: the plan computes them, since the kept tokens set the denominators);
                # else each micro-batch's, against the update's own logprobs (the old policy's on-policy).
                whole: Corrected | None = None
                if corr.active and mb.old_log_probs is not None:
                    whole = correct(
                        mb.old_log_probs.to(self.device), mb.rollout_log_probs.to(self.device),
                        mask_all.to(self.device), corr,
                    )  # fmt: skip
                    if epoch == 0:  # the batch's statistics, not the update's
                        corr_sums += whole.sums
                        corr_maxes = torch.maximum(corr_maxes, whole.maxes)
                assert whole is not None or not corr.rejects, "the plan computes old logprobs for the rejection"
                keep_all = whole.keep_bt if whole is not None else None
                scale = self._scale(mask_all if keep_all is None else mask_all.to(self.device) * keep_all)
                # Rows whose every trained token has advantage 0 add exactly nothing but their share of `scale`.
                dead = False
                if self.skip_zero_advantage:
                    assert mb.advantages is not None
                    live_rows = informative_rows(mb.advantages, mask_all)
                    rows_seen += len(mb) if epoch == 0 else 0
                    rows_skipped += len(mb) - len(live_rows) if epoch == 0 else 0
                    if len(live_rows) < len(mb):
                        dead = not len(live_rows)  # this rank still runs the stand-ins FSDP's collectives need
                        pick = live_rows if len(live_rows) else torch.tensor([0])
                        mb, mask_all = mb.select(pick), mask_all[pick]
                        if whole is not None:
                            w, k = whole.weights_bt, whole.keep_bt
                            on = pick.to(w.device if w is not None else k.device if k is not None else "cpu")
                            whole = replace(
                                whole,
                                weights_bt=w[on] if w is not None else None,
                                keep_bt=k[on] if k is not None else None,
                            )
                self.optimizer.zero_grad(set_to_none=True)
                plan = plan_micro_batches(
                    mb.attention_mask, mb.response_width, self.micro_batch_samples, self.token_budget, packed,
                    self.group, self.device, prompts=mb.input_ids if self.shared else None,
                )  # fmt: skip
                for step in plan:
                    micro, live = step.rows, step.live and not dead
                    trace = RouteTrace() if self.moe else None
                    topk = mb.teacher_topk  # forward_kl_topk: the teacher's top-k ids scored in the same pass
                    logp, ent, cells, placed = forward_log_probs(
                        self.model, mb, step, self.temperature, self.device, packed, self.shared, self.shard,
                        MoeForward(self.replay, trace) if self.moe else None, self.truncation,
                        Score(labels=topk[..., 1].long()) if topk is not None else None,
                    )  # fmt: skip
                    student_topk = None
                    if topk is not None:  # [b, R, 1 + k]: the sampled token's log p, then the teacher's ids'
                        logp, student_topk = logp[..., 0], logp[..., 1:]
                    padded_cells += cells
                    placed_cells += placed if live else 0  # a stand-in's cells are all padding
                    if live:
                        lengths = mb.attention_mask[micro].sum(-1)
                        real_cells += float(lengths.sum())
                        work[0] += float(mb.response_mask[micro].sum())
                        work[1] += causal_pairs(lengths)
                        work[2] += len(lengths)
                    mask = mask_all[micro].to(self.device) * float(live)  # a stand-in trains nothing
                    adv = mb.advantages[micro].to(self.device)  # type: ignore[index]
                    old = mb.old_log_probs[micro].to(self.device) if mb.old_log_probs is not None else logp.detach()
                    rollout_lp = mb.rollout_log_probs[micro].to(self.device)
                    first = epoch == 0
                    weights, keep = None, None
                    if whole is not None:
                        weights = whole.weights_bt[micro] if whole.weights_bt is not None else None
                        keep = whole.keep_bt[micro] if whole.keep_bt is not None else None
                    elif corr.active:
                        part = correct(old, rollout_lp, mask, corr)
                        weights = part.weights_bt
                        if first:
                            corr_sums += part.sums
                            corr_maxes = torch.maximum(corr_maxes, part.maxes)
                    # Rejected tokens leave every loss term and its denominators (`scale`), as in verl.
                    kept = mask if keep is None else mask * keep
                    # clip_cov / kl_cov select over this micro-batch's trained tokens, as verl's per-micro-batch loss
                    draw = selection_generator(self.seed, update_index, micro_index, dp_rank)
                    micro_index += 1
                    out = nll_loss(logp) if self.supervised else policy_loss(a, logp, old, adv, kept, draw)
                    loss_bt = out.loss_bt if weights is None else out.loss_bt * weights
                    pg = agg_loss(loss_bt, kept, a.loss_agg_mode, scale)
                    loss = pg - a.entropy_coeff * agg_loss(ent, kept, a.loss_agg_mode, scale) if a.entropy_coeff else pg
                    distill_sum, masses = zero, torch.zeros(2, dtype=torch.float64, device=self.device)
                    if self.distill is not None:
                        d = self.distill
                        if student_topk is not None:
                            assert topk is not None
                            fkl = forward_kl_topk(
                                student_topk.detach() if d.use_policy_gradient else student_topk,
                                topk[micro][..., 0].to(self.device), kept,
                                log_prob_min_clamp=d.log_prob_min_clamp, loss_max_clamp=d.loss_max_clamp,
                            )  # fmt: skip
                            est = fkl.loss_bt
                            masses = torch.stack(
                                [(x.double() * kept.double()).sum() for x in (fkl.student_mass_bt, fkl.teacher_mass_bt)]
                            )
                        else:
                            assert mb.teacher_log_probs is not None, "the trainer computes the teacher's logprobs"
                            teacher = mb.teacher_log_probs[micro].to(self.device)
                            est = reverse_kl_estimate(
                                logp.detach() if d.use_policy_gradient else logp, teacher, d.loss_mode,
                                loss_max_clamp=d.loss_max_clamp,
                            )  # fmt: skip
                        if d.use_policy_gradient:  # -sg[estimate] as the advantage of a second PPO term
                            d_adv = distillation_advantages(est, d.distillation_loss_coef, d.use_task_rewards)
                            d_bt = policy_loss(self.vanilla, logp, old, d_adv, kept).loss_bt  # verl's: vanilla
                            d_bt = d_bt if weights is None else d_bt * weights
                        else:
                            d_bt = distillation_weight(d.distillation_loss_coef, d.use_task_rewards) * est
                        term = agg_loss(d_bt, kept, a.loss_agg_mode, scale)
                        loss = (loss if d.use_task_rewards else loss - pg) + term
                        distill_sum = (est.detach().double() * kept.double()).sum()
                    if a.use_kl_loss:
                        assert mb.ref_log_probs is not None, "the trainer computes reference logprobs for the KL loss"
                        kl_bt = kl_penalty(logp, mb.ref_log_probs[micro].to(self.device), a.kl_loss_type)
                        kl_term = agg_loss(kl_bt, kept, a.loss_agg_mode, scale)
                        loss = loss + a.kl_loss_coef * kl_term
                    aux, differ, decisions = zero, zero, zero
                    if trace is not None and trace.logits:
                        # the load-balancing loss of each forward, averaged over the mini-batch's forwards
                        aux = trace.aux_loss() * (float(live) / len(plan))
                        if a.router_aux_loss_coef:
                            loss = loss + a.router_aux_loss_coef * aux
                        if first:
                            differ, decisions = (x.to(self.device) * float(live) for x in trace.disagreement())
                    loss.backward()
                    with torch.no_grad():
                        m = kept.double()
                        acc += torch.stack(
                            [
                                m.sum(),
                                (out.ratio_bt * m).sum(),
                                (out.clipped_bt * m).sum(),
                                (out.dual_clipped_bt * m).sum(),
                                (out.approx_kl_bt * m).sum(),
                                (ent * m).sum(),
                                ((logp.detach() - rollout_lp).abs() * mask.double()).sum() if first else zero,
                                mask.double().sum() if first else zero,
                                pg.detach().double() / self.dp_size,
                                kl_term.detach().double() / self.dp_size if a.use_kl_loss else zero,
                                aux.detach().double() / self.dp_size,
                                differ,
                                decisions,
                                distill_sum,
                                *masses,
                            ]
                        )
                grad_norms.append(self._step())
        self.optimizer.zero_grad(set_to_none=True)  # the gradients are not needed until the next update
        lr = float(self.optimizer.param_groups[0]["lr"])  # what this step trained at (verl logs it so too)
        self.scheduler.step()
        values = torch.cat([acc, corr_sums, corr_maxes]).tolist()  # the update's one read of its sums
        sums = dict(zip(SUMS, values[: len(SUMS)], strict=True))
        corr_local = dict(zip(STAT_SUMS + STAT_MAXES, values[len(SUMS) :], strict=True))
        pg_total, kl_total, aux_total = sums.pop("pg"), sums.pop("kl_loss"), sums.pop("moe_aux")
        distill_total, student_mass, teacher_mass = (sums.pop(k) for k in ("distill", "student_mass", "teacher_mass"))
        counts = (real_cells, placed_cells, padded_cells)
        metrics = self._metrics(sums, corr_local, pg_total, kl_total, aux_total, grad_norms, counts, batch)
        metrics |= self._flops_metrics(work, real_cells, placed_cells, time.perf_counter() - started)
        if self.distill is not None:  # the estimate's mean over every trained token of the update
            d_sum, s_mass, t_mass, d_tokens = global_sum(
                torch.tensor([distill_total, student_mass, teacher_mass, sums["tokens"]], dtype=torch.float64),
                self.group, self.device,
            ).tolist()  # fmt: skip
            metrics["distill/loss"] = d_sum / max(d_tokens, 1.0)
            if self.distill.loss_mode == "forward_kl_topk":  # verl's distillation/student_mass, teacher_mass
                metrics["distill/student_mass"] = s_mass / max(d_tokens, 1.0)
                metrics["distill/teacher_mass"] = t_mass / max(d_tokens, 1.0)
            metrics["distill/coef"] = distillation_weight(
                self.distill.distillation_loss_coef, self.distill.use_task_rewards
            )
        if self.skip_zero_advantage:
            seen, skipped = global_sum(
                torch.tensor([rows_seen, rows_skipped], dtype=torch.float64), self.group, self.device
            ).tolist()
            metrics["actor/skipped_samples_frac"] = skipped / max(seen, 1.0)
        return metrics | {"actor/lr": lr}

    def _flops_metrics(self, work: list[float], real: float, placed: float, seconds: float) -> dict[str, float]:
        """perf/tflops/actor: the update's model FLOPs (`workers/flops.py`) per actor rank and second of the slowest
        rank's update; perf/mfu/actor: their share of the device's dense peak, where it is known."""
        responses, pairs, samples = work
        pairs = shared_pairs(pairs, real, placed, real - responses, samples)
        local = training_flops(self.flops, placed, responses, pairs) / self.sp  # an sp group's ranks share its rows
        tot = reduce_metrics({"flops": ("mean", local), "seconds": ("max", seconds)}, self.group, self.device)
        tflops = tot["flops"] / max(tot["seconds"], 1e-9) / 1e12
        out = {"perf/tflops/actor": tflops}
        if self.peak_tflops is not None:
            out["perf/mfu/actor"] = tflops / self.peak_tflops
        return out

    def _step(self) -> float:
        grad_norm = clip_grad_norm(self.model, self.cfg.grad_clip)
        # A NaN/inf loss gives a non-finite gradient norm too: one check covers both.
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.consecutive_skips = 0
        else:
            self.nonfinite_skips += 1
            self.consecutive_skips += 1
            self.optimizer.zero_grad(set_to_none=True)
            log.warning("non-finite loss or gradient norm: update skipped (%d so far)", self.nonfinite_skips)
        return grad_norm

    def _metrics(
        self,
        sums: dict[str, float],
        corr_local: dict[str, float],
        pg_total: float,
        kl_total: float,
        aux_total: float,
        grad_norms: list[float],
        cells: tuple[float, int, int],
        batch: Batch,
    ) -> dict[str, float]:
        a = self.cfg
        real, placed, computed = cells
        local = {k: ("sum", v) for k, v in sums.items()} | {"pg": ("sum", pg_total), "kl_loss": ("sum", kl_total)}
        local["moe_aux"] = ("sum", aux_total)
        if self.correction.active:
            local |= {f"corr.{k}": ("max" if k in STAT_MAXES else "sum", v) for k, v in corr_local.items()}
        if batch.old_log_probs is not None:  # the proximal policy is the batch's: compare the engine with it
            m = batch.train_mask
            local["diff"] = ("sum", float(((batch.old_log_probs - batch.rollout_log_probs).abs() * m).sum()))
            local["diff_tokens"] = ("sum", float(m.sum()))
        params = list(self.model.parameters())
        opt_state = [t for st in self.optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        local["param_bytes"] = ("max", float(sum(map(local_bytes, params))))
        local["grad_bytes"] = ("max", float(sum(local_bytes(p) for p in params if p.requires_grad)))
        local["optimizer_bytes"] = ("max", float(sum(map(local_bytes, opt_state))))
        tot = reduce_metrics(local, self.group, self.device)
        tokens, steps = max(tot["tokens"], 1.0), len(grad_norms)
        out: dict[str, Any] = {
            "actor/loss": tot["pg"] / steps + (a.kl_loss_coef * tot["kl_loss"] / steps if a.use_kl_loss else 0.0),
            "actor/pg_loss": tot["pg"] / steps,
            "actor/ppo_ratio_mean": tot["ratio"] / tokens,
            "actor/pg_clipfrac": tot["clipped"] / tokens,
            "actor/pg_clipfrac_lower": tot["dual_clipped"] / tokens,
            "actor/ppo_kl": tot["kl"] / tokens,
            "actor/entropy": tot["entropy"] / tokens,
            "actor/grad_norm": sum(grad_norms) / steps,
            "actor/optimizer_steps": float(steps),
            # cells computed that hold no token (padding, a packed row's slack), and tokens a shared prompt saved
            "perf/padding_frac": 1.0 - placed / max(computed, 1),
            "perf/shared_prompt_frac": 1.0 - placed / max(real, 1.0),
            "actor/nonfinite_skips": float(self.nonfinite_skips),
            # what a rank holds between updates (the largest rank's shards) and the model's sizes (global numel)
            "perf/param_bytes": tot["param_bytes"],
            "perf/grad_bytes": tot["grad_bytes"],
            "perf/optimizer_bytes": tot["optimizer_bytes"],
            "perf/params": float(sum(p.numel() for p in params)),
            "perf/trainable_params": float(sum(p.numel() for p in params if p.requires_grad)),
            "rollout/logprob_diff": tot["diff"] / max(tot["diff_tokens"], 1.0),
        }
        if self.supervised:  # SFT has no policy ratio: these describe nothing there
            for key in RATIO_METRICS:
                del out[key]
        if a.use_kl_loss:
            out |= {"actor/kl_loss": tot["kl_loss"] / steps, "actor/kl_coef": a.kl_loss_coef}
        if self.moe:
            out["actor/moe_aux_loss"] = tot["moe_aux"] / steps
            if tot["route_decisions"]:
                out["rollout/router_mismatch"] = tot["route_differ"] / tot["route_decisions"]
        if self.correction.active:
            out |= correction_metrics({k: tot[f"corr.{k}"] for k in corr_local}, self.correction)
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the DCP model/optimizer shards."""
        return {"scheduler": self.scheduler.state_dict(), "nonfinite_skips": self.nonfinite_skips}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_scheduler(self.scheduler, state["scheduler"])
        self.nonfinite_skips = int(state["nonfinite_skips"])


class AdapterOffReference:
    """The reference policy of a LoRA run: the actor's own model with its adapter disabled; no second copy
    and no reference role."""

    field = "ref_log_probs"

    def __init__(self, actor: Actor) -> None:
        self.actor = actor

    def log_probs(self, batch: Batch) -> torch.Tensor:
        return self.actor.base_log_probs(batch)


def local_bytes(t: torch.Tensor) -> int:
    """Bytes of this rank's part of a tensor: a DTensor's local shard, else the whole tensor."""
    part = t.to_local() if isinstance(t, DTensor) else t
    return part.numel() * part.element_size()
