"""The RL step on the actor's ranks: rollout -> (old, reference, value tensors) -> advantage -> updates -> sync.

`Trainer.train_step` reads as the data flows. Where a role sits (on these ranks or its own) was decided once,
when the roles were built: the rollout source, critic and reference are local objects or proxies with the
same interface (workers/remote.py). `build_program` picks what a rank runs; `loop.fit` drives it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torchrl_post import faults
from torchrl_post.agent.base import AGENT_TERMINATIONS, METRIC_NAMES
from torchrl_post.algos.estimators import estimate_advantages
from torchrl_post.algos.kl import AdaptiveKLController, FixedKLController
from torchrl_post.checkpoint.dcp import Checkpointer
from torchrl_post.checkpoint.hf import write_adapter_config, write_hf_meta, write_hf_weights
from torchrl_post.config.errors import TrainingError
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import uses_rollout_is
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.distributed.placement import dp_group
from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.logging.timing import Timer
from torchrl_post.loop import RankProgram, Run, Trained
from torchrl_post.rollout.filters import masked_reasons
from torchrl_post.rollout.source import RolloutSource
from torchrl_post.sync.lora import is_adapter, lora_scale, merged_weights
from torchrl_post.sync.weights import BroadcastSync, ReloadSync, iter_full_weights
from torchrl_post.types import TERMINATIONS, Batch
from torchrl_post.workers.actor import Actor, AdapterOffReference
from torchrl_post.workers.remote import (
    CriticRole,
    ReferenceRole,
    RemoteCritic,
    RemoteReference,
    RemoteRollouts,
    RoleServer,
    RolloutServer,
    build_critic,
    build_reference,
    link,
    mini_batch_samples,
)

log = logging.getLogger("torchrl_post")


def build_program(run: Run) -> RankProgram:
    """The actor's ranks train; ranks with only an engine serve rollouts; the rest serve a critic/reference."""
    if run.topo.has("actor"):
        return Trainer(run)
    if run.topo.has("rollout"):
        return RolloutServer(run)
    return RoleServer(run)


class Trainer:
    def __init__(self, run: Run) -> None:
        self.run, cfg, topo = run, run.cfg, run.topo
        self.timer = Timer()
        dp = len(run.actor_ranks)
        self.actor = Actor(
            cfg.model,
            cfg.actor,
            topo.mesh("actor"),
            run.env.device,
            temperature=cfg.rollout.temperature,
            mini_batch_samples=mini_batch_samples(cfg, dp),
            max_response_length=cfg.data.max_response_length,
            is_cap=cfg.algorithm.rollout_is_threshold if uses_rollout_is(cfg) else 0.0,
        )
        self.group = dp_group(topo.mesh("actor"))
        # Roles exist only when something uses them (resolve_roles placed them), here or on ranks of their own.
        self.critic: CriticRole | None = None
        if topo.has("critic"):
            self.critic = build_critic(run)
        elif topo.links.get("critic") is not None:
            self.critic = RemoteCritic(link(run, "critic"))
        self.reference: ReferenceRole | None = None
        if topo.has("reference"):
            self.reference = build_reference(run)
        elif topo.links.get("reference") is not None:
            self.reference = RemoteReference(link(run, "reference"))
        elif cfg.model.lora_rank > 0 and (cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward):
            self.reference = AdapterOffReference(self.actor)
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl = (
            AdaptiveKLController(kc.kl_coef, kc.target_kl, kc.horizon)
            if kc.type == "adaptive"
            else FixedKLController(kc.kl_coef)
        )
        on_policy = cfg.actor.ppo_epochs == 1 and cfg.actor.ppo_mini_batch_size in (0, cfg.data.train_batch_size)
        self.needs_old = not on_policy or cfg.algorithm.use_kl_in_reward
        self.rollouts: RolloutSource
        self.weights: ReloadSync | BroadcastSync
        keep = is_adapter if cfg.model.lora_rank > 0 and cfg.rollout.lora_sync == "adapter" else None
        if run.disaggregated:
            self.rollouts = RemoteRollouts(run, self.timer)
            dtype = getattr(torch, cfg.rollout.dtype)
            bucket = cfg.rollout.sync_bucket_mb << 20
            self.weights = BroadcastSync(topo.sync, run.env.device, bucket, dtype, self.actor.model, keep)
        else:
            self.rollouts = run.engine_source(run.sampler(run.actor_ranks.index(run.env.rank), dp), self.timer)
            self.weights = ReloadSync(self.rollouts.engine, cfg.rollout.sync_bucket_mb, keep)

    def step(self, step: int) -> dict[str, float]:
        self.timer.reset()
        t0 = time.perf_counter()
        metrics = self.train_step(step)
        elapsed = time.perf_counter() - t0
        if self.run.is_main and (warning := logprob_diff_warning(metrics, self.run.cfg)) is not None:
            log.warning("step %d: %s", step, warning)
        tokens = metrics.pop("_tokens")
        return {
            "training/global_step": step,
            "training/epoch": self.rollouts.epoch,
            **metrics,
            **self.timer.metrics(),
            "timing_s/step": elapsed,
            "perf/throughput": tokens / elapsed / self.run.env.world_size,
        }

    def train_step(self, step: int) -> dict[str, float]:
        timed = self.timer.timed  # timed(stage, fn, *args) -> fn(*args), recorded as timing_s/<stage>
        batch = self._even(self.rollouts.next_batch(step))  # prompts -> engine -> reward, on this rank
        if self.needs_old:
            batch.old_log_probs = timed("old_log_prob", self.actor.log_probs, batch)
        if self.reference is not None:
            batch.ref_log_probs = timed("ref", self.reference.log_probs, batch)
        if self.critic is not None:
            batch.values = timed("values", self.critic.values, batch)
        metrics = timed("adv", self._advantages, batch, step)
        critic_metrics = timed("update_critic", self.critic.start_update, batch) if self.critic else dict
        metrics |= timed("update_actor", self.actor.update, batch)
        metrics |= timed("wait_critic", critic_metrics)
        self._check_finite(step)
        metrics["perf/sync_bytes"] = float(timed("sync", self.weights.push, self.actor.model))
        return metrics | self._batch_metrics(batch) | self.rollouts.metrics()

    def _even(self, batch: Batch) -> Batch:
        """Step-wise batches differ in rows per rank, and FSDP ranks must run the same mini- and
        micro-batches: every rank pads to the longest with copies of its first row at weight 0 (`traj_ids`
        -1: no advantage, no loss, no denominator)."""
        if batch.traj_ids is None:
            return batch
        rows = int(reduce_metrics({"rows": ("max", float(len(batch)))}, self.group)["rows"])
        if rows == len(batch):
            return batch
        pad = batch.select(torch.zeros(rows - len(batch), dtype=torch.long))
        pad.weights = torch.zeros(len(pad))
        pad.traj_ids = torch.full((len(pad),), -1, dtype=torch.long)
        return Batch.concat([batch, pad], self.run.tokenizer.pad_token_id)

    def _advantages(self, batch: Batch, step: int) -> dict[str, float]:
        """The estimator over the batch; the adaptive KL coefficient follows the reduced KL penalty."""
        coef = self.kl_ctrl.value
        metrics = reduce_metrics(estimate_advantages(self.run.cfg.algorithm, batch, self.run.cfg.rollout.n, coef))
        if "actor/reward_kl_penalty" in metrics:
            self.kl_ctrl.update(metrics["actor/reward_kl_penalty"], n_steps=len(batch) * len(self.run.actor_ranks))
            metrics["actor/reward_kl_penalty_coeff"] = coef
        if faults.active("nan_advantages", step, self.run.env.rank):
            batch.advantages = torch.full_like(batch.loss_mask, float("nan"))
        return metrics

    def _check_finite(self, step: int) -> None:
        limit = self.run.cfg.trainer.max_nonfinite_skips
        if self.actor.consecutive_skips >= limit:
            latest = Checkpointer(self.run.run_dir, self.run.env.rank, None).latest()
            raise TrainingError(
                f"step {step}: {self.actor.consecutive_skips} consecutive updates had a non-finite loss or gradient "
                f"norm (trainer.max_nonfinite_skips={limit}); stopping. The last good checkpoint is "
                f"{latest or 'none'}; lower actor.lr or check the rewards and data"
            )

    def _batch_metrics(self, batch: Batch) -> dict[str, float]:
        """Scores, lengths and advantages of the step's samples, over every actor rank."""
        assert batch.scores is not None and batch.advantages is not None and batch.reward_errors is not None
        mask, scores = batch.response_mask, batch.scores
        scored = _trajectory_rows(batch)  # a step-wise trajectory's score counts once
        resp_len = mask.sum(-1)
        tokens = max(batch.loss_mask.sum().item(), 1.0)
        # Compact filtering: the fraction of samples masked for each flagged termination reason.
        masked = {
            f"filter/{reason}": ("sum", float((batch.termination == TERMINATIONS.index(reason)).sum()))
            for reason in masked_reasons(self.run.cfg.algorithm.compact_filtering)
        }
        if batch.turns is not None:  # agent episodes: turns, tool calls and why they ended, per trajectory
            masked |= _trajectory_sums(batch)
        out = reduce_metrics(
            masked
            | {
                "n": ("sum", float(len(batch))),
                "score": ("sum", float(scores[scored].sum())),
                "scored": ("sum", float(scored.sum())),
                "resp_len": ("sum", float(resp_len.sum())),
                "prompt_len": ("sum", float((batch.attention_mask.sum(-1) - resp_len).sum())),
                "length": ("sum", float((batch.termination == TERMINATIONS.index("length")).sum())),
                "reward/errors": ("sum", float(batch.reward_errors.sum())),
                "critic/advantages/mean": ("mean", float((batch.advantages * batch.loss_mask).sum() / tokens)),
                "_tokens": ("sum", float(batch.attention_mask.sum())),
                "critic/score/max": ("max", float(scores.max())),
                "critic/score/min": ("min", float(scores.min())),
                "response_length/max": ("max", float(resp_len.max())),
            }
        )
        n = out.pop("n")
        out |= {k: v / n for k, v in out.items() if k.startswith("filter/")}
        if "_trajectories" in out:
            trajectories = max(out.pop("_trajectories"), 1.0)
            out |= {k: v / trajectories for k, v in out.items() if k.startswith("agent/") and k != "agent/tool_errors"}
        out["critic/score/mean"] = out["critic/rewards/mean"] = out.pop("score") / max(out.pop("scored"), 1.0)
        out["response_length/mean"] = out.pop("resp_len") / n
        out["response_length/clip_ratio"] = out.pop("length") / n
        out["prompt_length/mean"] = out.pop("prompt_len") / n
        for key, values in batch.reward_extra.items():  # this rank's samples that returned the key
            given = values[~values.isnan()]
            if len(given):
                out[f"reward/{key}"] = float(given.mean())
        return out

    # ---- the loop's hooks ----------------------------------------------------------------------------
    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return self.rollouts.validation_totals(data, sources)

    def val_samples(self) -> list[dict[str, Any]]:
        return self.rollouts.val_samples

    def trained_roles(self) -> dict[str, Trained]:
        critic = self.critic.trained() if self.critic is not None else {}
        return {"actor": (self.actor.model, self.actor.optimizer), **critic}

    def state_dict(self) -> dict[str, Any]:
        state = {"rollouts": self.rollouts.state_dict(), "actor": self.actor.state_dict()}
        state["kl_ctrl"] = self.kl_ctrl.state_dict()
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.rollouts.load_state_dict(state["rollouts"])
        self.actor.load_state_dict(state["actor"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    def after_resume(self) -> None:
        self.weights.push(self.actor.model)

    def write_hf(self, ckpt_tmp: Path) -> None:
        """hf/: config and tokenizer always (for export); the gathered weights too with trainer.save_hf."""
        out, m = ckpt_tmp / "hf", self.run.cfg.model
        if self.run.is_main:
            write_hf_meta(self.actor.model.config, self.run.processor or self.run.tokenizer, out)
            if m.lora_rank > 0:  # adapter_config.json: export rebuilds the PEFT model from it
                write_adapter_config(self.actor.model, m.path, out)
        if self.run.cfg.trainer.save_hf:
            weights = iter_full_weights(self.actor.model, self.run.cfg.rollout.sync_bucket_mb << 20)
            if m.lora_rank > 0:  # the merged model, loadable as a plain HF model
                weights = merged_weights(weights, lora_scale(m.lora_rank, m.lora_alpha))
            write_hf_weights(weights, out, self.run.is_main)

    def shutdown(self) -> None:
        self.rollouts.shutdown()


def logprob_diff_warning(metrics: Mapping[str, float], cfg: Config) -> str | None:
    """The warning for a step whose `rollout/logprob_diff` (engine vs trainer logprobs of the same tokens)
    exceeds `trainer.max_logprob_diff`, or None. Checked only where the two compare like with like: float32
    engine and trainer (bf16 noise is 1e-2), on-policy generation (`rollout/staleness` 0: look-ahead samples
    older weights on purpose) and untruncated sampling (with top_k/top_p the engine reports logprobs of the
    truncated distribution). There float32 noise is about 1e-6: far above it, the engine samples weights the
    trainer does not have."""
    limit, diff = cfg.trainer.max_logprob_diff, metrics.get("rollout/logprob_diff")
    if limit <= 0 or diff is None or not diff > limit:
        return None
    if cfg.rollout.dtype != "float32" or cfg.actor.fsdp.param_dtype != "float32":
        return None
    if metrics.get("rollout/staleness", 0.0) > 0 or cfg.rollout.top_k > 0 or cfg.rollout.top_p < 1.0:
        return None
    return (
        f"ENGINE/TRAINER MISMATCH: rollout/logprob_diff = {diff:.3g} > trainer.max_logprob_diff = {limit:g} with "
        "float32 engine and trainer, where the two agree to about 1e-6. The engine is most likely sampling with "
        "weights the trainer does not have: a weight sync that missed a parameter (check tied embeddings, "
        "tie_word_embeddings, and custom parameter names against the engine's). Raise trainer.max_logprob_diff "
        "if this difference is expected, or set it to 0 to turn the check off"
    )


def _trajectory_sums(batch: Batch) -> dict[str, tuple[str, float]]:
    """Sums over this rank's agent trajectories (one row each; a step-wise batch counts its last steps)."""
    assert batch.turns is not None and batch.tool_calls is not None and batch.tool_errors is not None
    rows = _trajectory_rows(batch)
    out = {
        "_trajectories": ("sum", float(rows.sum())),
        "agent/num_turns/mean": ("sum", float(batch.turns[rows].sum())),
        "agent/tool_calls/mean": ("sum", float(batch.tool_calls[rows].sum())),
        "agent/tool_errors": ("sum", float(batch.tool_errors[rows].sum())),
    }
    for reason in AGENT_TERMINATIONS:
        out[f"agent/termination/{METRIC_NAMES.get(reason, reason)}"] = (
            "sum",
            float((batch.termination[rows] == TERMINATIONS.index(reason)).sum()),
        )
    return out


def _trajectory_rows(batch: Batch) -> torch.Tensor:
    """[B] bool: one row per sample, or per trajectory in a step-wise batch (its last step; no padding)."""
    if batch.traj_ids is None or batch.step_ids is None or batch.turns is None:
        return torch.ones(len(batch), dtype=torch.bool)
    return (batch.traj_ids >= 0) & (batch.step_ids == (batch.turns.long() - 1).clamp(min=0))
