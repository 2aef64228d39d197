"""The RL step on the actor's ranks: rollout -> reward-model scores -> (old, reference, value tensors) -> advantage
-> updates -> sync.

`Trainer.train_step` reads as the data flows. Where each role sits (on these ranks or its own) was decided once,
in the run plan, and the roles were built for it (build.py): the rollout source, reward model, critic and reference are
local objects or proxies with the same interface (rollout/remote.py, workers/remote.py). `loop.fit` drives the steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from torchrl_post import faults
from torchrl_post.algos.estimators import estimate_advantages
from torchrl_post.algos.kl import AdaptiveKLController, FixedKLController
from torchrl_post.algos.sampling_support import sampler_truncation
from torchrl_post.batch_metrics import batch_metrics
from torchrl_post.checkpoint.dcp import Checkpointer, Trained
from torchrl_post.checkpoint.hf import write_adapter_config, write_hf_meta, write_hf_weights
from torchrl_post.config.errors import TrainingError
from torchrl_post.config.schema import Config, RolloutConfig
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.distributed.placement import all_reduce_max, all_reduce_sum, dp_group
from torchrl_post.logging.reduce import reduce_metrics
from torchrl_post.logging.timing import Timer
from torchrl_post.plan import RunPlan
from torchrl_post.reward.mixing import mix_scores, source_metrics
from torchrl_post.rollout.source import RolloutSource
from torchrl_post.sync.lora import lora_scale, merged_weights
from torchrl_post.sync.weights import iter_full_weights
from torchrl_post.types import Batch
from torchrl_post.workers.actor import Actor
from torchrl_post.workers.remote import CriticRole, ReferenceRole, RewardModelRole

log = logging.getLogger("torchrl_post")


class NoEngine:
    """The `WeightSync` of a run without an engine (SFT): nothing to push."""

    def push(self, model: torch.nn.Module) -> int:
        return 0


class WeightSync(Protocol):
    """The actor's weights into the engines: in-process reload or broadcast (sync/weights.py)."""

    def push(self, model: torch.nn.Module) -> int:
        """Returns the bytes moved."""
        ...


@dataclass
class StepRoles:
    """What the actor's ranks step with, each built for where the plan put it (build.py)."""

    actor: Actor
    rollouts: RolloutSource
    weights: WeightSync
    critic: CriticRole | None = None
    reference: ReferenceRole | None = None
    reward_model: RewardModelRole | None = None
    teacher: ReferenceRole | None = None
    """The distillation teacher: the reference's role over another checkpoint (build.py `build_teacher`)."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    is_main: bool
    """The rank that writes the run's files."""
    run_dir: Path
    pad_id: int
    hf_meta: Any
    """Saved beside exported weights: the tokenizer, or a VLM's processor."""


class Trainer:
    def __init__(self, cfg: Config, plan: RunPlan, roles: StepRoles, timer: Timer, info: RankInfo) -> None:
        self.cfg, self.plan, self.info, self.timer = cfg, plan, info, timer
        self.actor, self.rollouts, self.weights = roles.actor, roles.rollouts, roles.weights
        self.critic, self.reference, self.reward_model = roles.critic, roles.reference, roles.reward_model
        self.teacher = roles.teacher
        self.group = dp_group(self.actor.mesh)
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl = (
            AdaptiveKLController(kc.kl_coef, kc.target_kl, kc.horizon)
            if kc.type == "adaptive"
            else FixedKLController(kc.kl_coef)
        )

    def step(self, step: int) -> dict[str, float]:
        self.timer.reset()
        t0 = time.perf_counter()
        metrics, tokens = self.train_step(step)
        elapsed = time.perf_counter() - t0
        if self.info.is_main and (warning := logprob_diff_warning(metrics, self.plan, self.cfg.rollout)) is not None:
            log.warning("step %d: %s", step, warning)
        return {
            "training/global_step": step,
            "training/epoch": self.rollouts.epoch,
            **metrics,
            **self.timer.metrics(),
            "timing_s/step": elapsed,
            "perf/throughput": tokens / elapsed / self.info.world_size,
        }

    def train_step(self, step: int) -> tuple[dict[str, float], float]:
        """This step's metrics and its tokens over every actor rank."""
        timed = self.timer.timed  # timed(stage, fn, *args) -> fn(*args), recorded as timing_s/<stage>
        if self.plan.sft:
            return self._supervised_step(step)
        self.actor.offload()  # the engine generates: the actor's host offload, where configured
        batch = self._even(self.rollouts.next_batch(step))  # prompts -> engine -> reward, on this rank
        # a reward model on ranks of its own scores while this step's logprobs are computed; colocated, now
        rm_scores = (
            timed("reward_model", self.reward_model.start_scores, batch) if self.reward_model is not None else None
        )
        if self.plan.needs_old_log_probs:
            batch.old_log_probs = timed("old_log_prob", self.actor.log_probs, batch)
        if self.reference is not None:
            batch.ref_log_probs = timed("ref", self.reference.log_probs, batch)
        if self.teacher is not None:
            setattr(batch, self.teacher.field, timed("teacher", self.teacher.log_probs, batch))
        if self.critic is not None:
            batch.values = timed("values", self.critic.values, batch)
        mixed = timed("wait_reward_model", self._mixed_scores, batch, rm_scores) if self.plan.mixes_rewards else {}
        metrics = timed("adv", self._advantages, batch, step)
        critic_metrics = timed("update_critic", self.critic.start_update, batch) if self.critic else dict
        metrics |= timed("update_actor", self.actor.update, batch)
        metrics |= timed("wait_critic", critic_metrics)
        self._check_finite(step)
        metrics["perf/sync_bytes"] = float(timed("sync", self.weights.push, self.actor.model))
        stats = batch_metrics(batch, self.plan.masked_reasons, step)
        return metrics | mixed | stats.metrics | self.rollouts.metrics(), stats.tokens

    def _supervised_step(self, step: int) -> tuple[dict[str, float], float]:
        """SFT (the plan's sft): the step's rows of the data (rollout/supervised.py) -> the actor's update on their
        negative log-likelihood; its metrics without the RL-only ones (ratios, clipping, rewards)."""
        batch = self.timer.timed("data", self.rollouts.next_batch, step)
        metrics = self.timer.timed("update_actor", self.actor.update, batch)
        stats = batch_metrics(batch, (), step)
        lengths = {k: v for k, v in stats.metrics.items() if k.startswith(("response_length/", "prompt_length/"))}
        return metrics | lengths | {"train/loss": metrics["actor/pg_loss"]} | self.rollouts.metrics(), stats.tokens

    def _mixed_scores(self, batch: Batch, rm_scores: Callable[[], torch.Tensor] | None) -> dict[str, float]:
        """The training score of every sample from its sources (reward.weights: the rule's score the producer
        left unshaped, the reward model's, the judge's), then DAPO's overlong penalty and the clamp (reward/shaping.py);
        reward/<source>/mean for each source scored."""
        p, rm = self.plan, rm_scores() if rm_scores is not None else batch.rm_scores  # scored as groups finished
        sources = mix_scores(
            batch, p.reward_weights, p.reward_combine, self.cfg.reward, self.cfg.data.max_response_length, rm
        )
        return source_metrics(sources, self.group)

    def _even(self, batch: Batch) -> Batch:
        """Step-wise batches differ in rows per rank, and FSDP ranks must run the same mini- and
        micro-batches: every rank pads to the longest with copies of its first row at weight 0 (`traj_ids`
        -1: no advantage, no loss, no denominator)."""
        if batch.traj_ids is None:
            return batch
        rows = int(all_reduce_max(float(len(batch)), self.group))
        if rows == len(batch):
            return batch
        pad = batch.select(torch.zeros(rows - len(batch), dtype=torch.long))
        pad.weights = torch.zeros(len(pad))
        pad.traj_ids = torch.full((len(pad),), -1, dtype=torch.long)
        return Batch.concat([batch, pad], self.info.pad_id)

    def _advantages(self, batch: Batch, step: int) -> dict[str, float]:
        """The estimator over the batch, whitened over every actor rank's rows where configured; the adaptive KL
        coefficient follows the reduced KL penalty."""
        coef = self.kl_ctrl.value
        sum_over_ranks = partial(all_reduce_sum, group=self.group)
        metrics = reduce_metrics(estimate_advantages(self.cfg.algorithm, batch, coef, sum_over_ranks))
        if "actor/reward_kl_penalty" in metrics:
            self.kl_ctrl.update(metrics["actor/reward_kl_penalty"], n_steps=len(batch) * len(self.plan.actor_ranks))
            metrics["actor/reward_kl_penalty_coeff"] = coef
        if faults.active("nan_advantages", step, self.info.rank):
            batch.advantages = torch.full_like(batch.loss_mask, float("nan"))
        return metrics

    def _check_finite(self, step: int) -> None:
        limit = self.cfg.trainer.max_nonfinite_skips
        if self.actor.consecutive_skips >= limit:
            latest = Checkpointer(self.info.run_dir, self.info.rank, None).latest()
            raise TrainingError(
                f"step {step}: {self.actor.consecutive_skips} consecutive updates had a non-finite loss or gradient "
                f"norm (trainer.max_nonfinite_skips={limit}); stopping. The last good checkpoint is "
                f"{latest or 'none'}; lower actor.lr or check the rewards and data"
            )

    # ---- the loop's hooks ----------------------------------------------------------------------------
    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        self.actor.offload()
        return self.rollouts.validation_totals(data, sources)

    def val_samples(self) -> list[dict[str, Any]]:
        return self.rollouts.val_samples

    def trained_roles(self) -> dict[str, Trained]:
        critic = self.critic.trained() if self.critic is not None else {}
        self.actor.onload()  # checkpoints read and write the shards where they train
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
        out, m = ckpt_tmp / "hf", self.cfg.model
        if self.info.is_main:
            write_hf_meta(self.actor.model.config, self.info.hf_meta, out)
            if self.plan.lora_sync != "none":  # adapter_config.json: export rebuilds the PEFT model from it
                write_adapter_config(self.actor.model, m.path, out)
        if self.cfg.trainer.save_hf:
            self.actor.onload()
            weights = iter_full_weights(self.actor.model, self.plan.sync_bucket_bytes)
            if self.plan.lora_sync != "none":  # the merged model, loadable as a plain HF model
                weights = merged_weights(weights, lora_scale(m.lora_rank, m.lora_alpha))
            write_hf_weights(weights, out, self.info.is_main)

    def shutdown(self, process_ends: bool = False) -> None:
        self.rollouts.shutdown(process_ends)


def logprob_diff_warning(metrics: Mapping[str, float], plan: RunPlan, rollout: RolloutConfig) -> str | None:
    """The warning for a step whose `rollout/logprob_diff` (engine vs trainer logprobs of the same tokens)
    exceeds the plan's threshold (`trainer.max_logprob_diff`, or by the engine's and trainer's precision:
    `plan.mismatch_limit`), or None. Checked only where the two compare like with like: on-policy generation
    (`rollout/staleness` 0: look-ahead samples older weights on purpose), and, where top_k/top_p truncate
    sampling, trainer logprobs renormalised on the kept set as the engine's are (the plan's sampling_support;
    actor.renormalize_logprobs_on_support=false leaves them over the full vocabulary). Far above the precision's
    noise, the engine samples weights the trainer does not have."""
    limit, diff = plan.max_logprob_diff, metrics.get("rollout/logprob_diff")
    if limit <= 0 or diff is None or not diff > limit:
        return None
    truncated = sampler_truncation(rollout.temperature, rollout.top_k, rollout.top_p) is not None
    if metrics.get("rollout/staleness", 0.0) > 0 or (truncated and plan.sampling_support is None):
        return None
    return (
        f"ENGINE/TRAINER MISMATCH: rollout/logprob_diff = {diff:.3g} > {limit:g}, far above the noise of an "
        f"{plan.engine.dtype} engine and a {plan.roles['actor'].fsdp.param_dtype} trainer on {plan.device}. The "
        "engine is most likely sampling with weights the trainer does not have: a weight sync that missed a "
        "parameter (check tied embeddings, tie_word_embeddings, and custom parameter names against the "
        "engine's). Set trainer.max_logprob_diff higher if this difference is expected, or to 0 to turn the "
        "check off"
    )
