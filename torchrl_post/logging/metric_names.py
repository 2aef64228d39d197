"""Every metric a run writes to metrics.jsonl (and wandb, TensorBoard), with what it means: the one table
`docs/metrics.md` is generated from (`python -m torchrl_post.logging.metric_names`; a test keeps it current and
checks that every metric name in the package's source is listed here).

Names follow verl's where verl has the metric. `<x>` stands for a part of the name a run fills in.
"""

from __future__ import annotations

import sys
from pathlib import Path

CLOCKED = ("timing_s/", "perf/throughput", "perf/tflops/", "perf/mfu/")
"""Prefixes of the metrics read from a clock: they differ between two runs of the same steps (an exact resume, a
replay of a recorded run compares every other metric)."""

SECTIONS: dict[str, str] = {
    "training": "Where the run is",
    "actor": "The policy update (reduced over the actor's ranks; per optimizer step averaged over the update)",
    "critic": "Scores, rewards, advantages and the value model",
    "rollout": "Generation and the engine",
    "rollout_corr": "The rollout correction (algorithm.rollout_correction: importance weights, rejection); "
    "ratios pi_old / pi_rollout over the trained tokens before rejection, a sequence's once per token",
    "response_length": "Lengths",
    "prompt_length": "Lengths",
    "reward": "The rewards: the rule function, the reward model, their mix (reward.weights)",
    "filter": "Filters (rejection sampling, compact filtering): fractions of the step's samples",
    "agent": "Agent episodes (per trajectory)",
    "val": "Validation (greedy unless rollout.val_kwargs.do_sample)",
    "train": "Supervised fine-tuning (sft.enable)",
    "data": "The data as loaded",
    "distill": "On-policy distillation (distillation.enable)",
    "perf": "Throughput and efficiency",
    "timing_s": "Seconds per stage of the step",
}

METRICS: dict[str, str] = {
    "training/global_step": "The step (0: validation before training).",
    "training/epoch": "The epoch over the training set.",
    "actor/loss": "The policy loss plus the KL loss term (when actor.use_kl_loss).",
    "actor/pg_loss": "The policy loss of actor.policy_loss (PPO clipped surrogate, GSPO, Clip-Cov, KL-Cov), "
    "aggregated by actor.loss_agg_mode.",
    "actor/ppo_ratio_mean": "Mean ratio pi / pi_old over the trained tokens (1 on-policy).",
    "actor/pg_clipfrac": "Fraction of trained tokens whose ratio was clipped; clip_cov: the tokens whose gradient "
    "the covariance draw cut (verl's), kl_cov: the tokens the KL penalty acted on.",
    "actor/pg_clipfrac_lower": "Fraction clipped by the dual clip (negative advantages, actor.clip_ratio_c).",
    "actor/ppo_kl": "Approximate KL(pi_old || pi) over the trained tokens (mean of log pi_old - log pi; kl_cov: "
    "of |log pi - log pi_old|, as verl).",
    "actor/entropy": "Mean entropy of the policy over the trained tokens.",
    "actor/moe_aux_loss": "Mixture-of-experts models: the routers' load-balancing loss (top-k when balanced), "
    "in the loss with weight actor.router_aux_loss_coef.",
    "actor/grad_norm": "Global gradient norm before clipping, averaged over the update's optimizer steps.",
    "actor/lr": "The learning rate this step trained at (actor.lr_scheduler_type; verl logs it so too).",
    "actor/optimizer_steps": "Optimizer steps in the update (mini-batches x ppo_epochs).",
    "actor/skipped_samples_frac": "Share of the step's samples whose forward and backward the update skipped: "
    "advantage 0 on every trained token (actor.skip_zero_advantage; only where nothing else reads them).",
    "actor/nonfinite_skips": "Updates skipped so far for a non-finite loss or gradient norm.",
    "actor/kl_loss": "The KL(actor || reference) loss term (actor.use_kl_loss).",
    "actor/kl_coef": "actor.kl_loss_coef.",
    "actor/reward_kl_penalty": "Mean KL penalty subtracted from the rewards (algorithm.use_kl_in_reward).",
    "actor/reward_kl_penalty_coeff": "The KL-in-reward coefficient used this step (adaptive or fixed).",
    "critic/score/mean": "Mean sample score from the reward function (verl's name; the training reward).",
    "critic/score/max": "Highest sample score.",
    "critic/score/min": "Lowest sample score.",
    "critic/full-score/mean": "Mean trajectory reward, each trajectory once (rLLM's name; a step-wise trajectory's "
    "on its last step): critic/score/mean.",
    "critic/full-score/max": "Highest trajectory reward.",
    "critic/full-score/min": "Lowest trajectory reward.",
    "critic/rewards/mean": "Mean reward after the KL penalty (equal to the score without one).",
    "critic/advantages/mean": "Mean advantage over the trained tokens.",
    "critic/returns/mean": "Mean return (estimators with returns: gae, reinforce).",
    "critic/advantage_clip_frac": "Fraction of trained tokens whose advantage algorithm.advantage_clip clamped "
    "(ROLL's name; a mean of the ranks' fractions).",
    "critic/values/mean": "Mean value of the critic (gae).",
    "critic/loss": "The clipped value loss.",
    "critic/vf_clipfrac": "Fraction of values clipped by critic.cliprange_value.",
    "critic/grad_norm": "The critic's gradient norm before clipping.",
    "critic/lr": "The learning rate the critic's step trained at (critic.lr_scheduler_type).",
    "rollout/logprob_diff": "Mean |engine - trainer| logprob of the same tokens: the sync check "
    "(trainer.max_logprob_diff).",
    "rollout/router_mismatch": "Mixture-of-experts models: the fraction of routing decisions (token x MoE layer) "
    "where the trainer's router, on its own, picks other experts than the engine recorded (before the update's "
    "first optimizer step; with actor.router_replay the recorded ones are used anyway).",
    "rollout/staleness": "Weight versions between the generating policy and the trained one (0 on-policy).",
    "rollout/staleness_mean": "Mean over the step's groups of their staleness (a group's: the trained policy's version "
    "less the oldest version among its tokens).",
    "rollout/staleness_groups/<s>": "The step's groups at staleness 0, 1, 2, 3 and 4+ (a histogram per step).",
    "rollout/partial_samples": "rollout.partial_rollout: share of the step's samples (with agent.env, trajectories) "
    "whose tokens came from more than one policy version (generated across a weight update).",
    "rollout/stale_dropped_groups": "rollout.partial_rollout: groups dropped since the last step for exceeding "
    "trainer.max_staleness (complete, or still generating and already too old).",
    "rollout/in_flight": "rollout.partial_rollout: requests (samples; with agent.env, episodes) still generating when "
    "the step took its groups, over all engines.",
    "training/off_policy/token_staleness/mean": "verl's behaviour-version metrics: the mean over trained response "
    "tokens of (the version the update starts from - the version that sampled the token); 0 on-policy.",
    "training/off_policy/token_staleness/max": "The stalest trained token's staleness.",
    "training/off_policy/token_staleness/min": "The freshest trained token's staleness.",
    "training/off_policy/token_staleness/stale_fraction": "Fraction of trained tokens sampled by an older policy.",
    "training/off_policy/cross_version_response_fraction": "Fraction of responses whose tokens come from more than "
    "one policy version (generated across a weight update: rollout.partial_rollout).",
    "training/off_policy/behavior_version/token_coverage": "Fraction of trained tokens whose sampling version is "
    "known (1 for every producer here; the staleness metrics cover only those).",
    "training/off_policy/behavior_version/response_coverage": "Fraction of the step's responses with a known "
    "version for some trained token.",
    "rollout_corr/is_weight_mean": "Mean importance weight applied: min(ratio, rollout_is_threshold), the ratio "
    "at the rollout_is level (token or sequence).",
    "rollout_corr/is_clipfrac": "Fraction of tokens whose importance weight hit the cap.",
    "rollout_corr/rollout_is_mean": "Mean ratio at the rollout_is level, before the cap (at most e^20).",
    "rollout_corr/rollout_is_std": "Standard deviation of that ratio.",
    "rollout_corr/rollout_is_max": "Largest ratio at the rollout_is level.",
    "rollout_corr/rollout_is_min": "Smallest ratio at the rollout_is level.",
    "rollout_corr/rollout_rs_mean": "Mean ratio at the rollout_rs level (token, sequence product or geometric mean).",
    "rollout_corr/rollout_rs_std": "Standard deviation of that ratio.",
    "rollout_corr/rollout_rs_max": "Largest ratio at the rollout_rs level.",
    "rollout_corr/rollout_rs_min": "Smallest ratio at the rollout_rs level.",
    "rollout_corr/rollout_rs_masked_fraction": "Fraction of trained tokens the rejection dropped (the veto apart).",
    "rollout_corr/rollout_rs_seq_masked_fraction": "Fraction of samples the rejection dropped a token of.",
    "rollout_corr/rollout_is_veto_fraction": "Fraction of samples dropped by rollout_token_veto_threshold.",
    "response_length/mean": "Mean response tokens per sample.",
    "response_length/max": "Longest response.",
    "response_length/clip_ratio": "Fraction of samples that hit data.max_response_length.",
    "prompt_length/mean": "Mean prompt tokens per sample.",
    "reward/errors": "Reward calls that raised, timed out or returned NaN (scored 0).",
    "reward/<key>": "The mean of an extra value a reward function returned in its dict.",
    "reward/<source>/mean": "With a reward model: each source's raw score over the step's samples, before the weights "
    "mix them (rule, reward_model); also /max and /min. critic/score/* is the mixed, shaped score trained on.",
    "reward/reward_model/truncated": "Fraction of samples whose conversation had more than reward_model.max_length "
    "of the reward model's tokens (its first ones dropped).",
    "filter/<reason>": "Fraction of samples masked by compact filtering for this termination reason.",
    "filter/rejection/<count>": "Rejection sampling: dropped_groups, extra_rounds, short_groups this step.",
    "agent/num_turns/mean": "Turns per trajectory.",
    "agent/tool_calls/mean": "Tool calls per trajectory.",
    "agent/tool_errors": "Tool calls that failed (malformed, unknown tool, a raising tool).",
    "val/test_score/<data_source>": "Validation score per data source (mean over its prompts).",
    "val/loss": "SFT: the validation rows' negative log-likelihood per trained token (under the actor, no engine).",
    "val/loss/<data_source>": "SFT with several data sources: val/loss of each source's rows.",
    "train/loss": "SFT: the step's negative log-likelihood per trained token (actor.loss_agg_mode; verl's name).",
    "data/truncated_responses": "SFT: training responses cut at data.max_response_length when loaded (sft.truncation).",
    "distill/loss": "The distillation estimate (distillation.loss_mode) per trained token of the student's samples, "
    "KL(student || teacher) at the sampled tokens (forward_kl_topk: KL(teacher || student) over the teacher's top-k "
    "at each position); falls as the student nears the teacher.",
    "distill/coef": "The distillation term's weight: distillation_loss_coef with use_task_rewards, else 1.",
    "distill/student_mass": "forward_kl_topk: the student's probability on the teacher's top-k tokens, per trained "
    "token (verl's distillation/student_mass); rises toward distill/teacher_mass as the student learns.",
    "distill/teacher_mass": "forward_kl_topk: the teacher's probability on its own top-k tokens, per trained token "
    "(the share of its distribution the loss sees; verl's distillation/teacher_mass).",
    "val/test_score/<data_source>/mean@<n>": "With rollout.val_kwargs.n > 1: mean over the n samples.",
    "val/test_score/<data_source>/pass@<n>": "With rollout.val_kwargs.n > 1: a prompt with any sample right.",
    "perf/throughput": "Trained tokens per second per rank.",
    "perf/tflops/actor": "The actor update's model FLOPs per rank and second (TFLOP/s): forward and backward of the "
    "tokens it computes (a shared prompt once), the LM head at the response positions and the causal attention "
    "pairs (workers/flops.py), over the slowest rank's update.",
    "perf/mfu/actor": "perf/tflops/actor over the device's dense 16-bit peak (verl's name), on the GPUs whose peak "
    "workers/flops.py lists and a bfloat16 or float16 trainer compute; elsewhere divide perf/tflops/actor by yours.",
    "perf/sync_bytes": "Bytes the weight sync moved this step.",
    "perf/padding_frac": (
        "Share of the computed token cells that held no token (padding; a packed row's slack where the batched rows "
        "run: eager attention, Ulysses)."
    ),
    "perf/shared_prompt_frac": "Share of tokens a shared prompt saved (packing with shared prompts).",
    "perf/param_bytes": "The actor's parameter bytes on the rank holding the most (its FSDP shards).",
    "perf/grad_bytes": "The actor's gradient bytes during a step on the rank holding the most (one per trainable "
    "parameter shard).",
    "perf/optimizer_bytes": "The actor's optimizer state bytes on the rank holding the most (its shards).",
    "perf/params": "The actor's parameters (the whole model's).",
    "perf/trainable_params": "The actor's trainable parameters (with LoRA: the adapters').",
    "timing_s/<stage>": "Seconds of a stage: gen, gen_engine, reward, reward_model (colocated: its scores; on ranks of its own: sending them the batch), old_log_prob, ref, teacher (the "
    "distillation teacher's logprobs), values, "
    "wait_reward_model (the wait for a reward model on ranks of its own, and the mix), adv, update_critic, update_actor, wait_critic, sync, testing (an SFT step: data, update_actor); timing_s/step for the whole step. With rollout "
    "ranks of their own, timing_s/gen is the actor's wait for the batch and timing_s/rollout_wait the longest a "
    "rollout rank was blocked in the last step's exchanges (the weight broadcast and the batch handover): with "
    "timing_s/step, the idle share of each side.",
}


def documented(name: str) -> bool:
    """Whether a metric name (or a pattern with `{...}` / `<...>` parts) is in METRICS."""
    import re

    def pattern(key: str) -> re.Pattern[str]:
        parts = re.split(r"<[^>]+>|\{[^}]*\}", key)
        return re.compile("[^/]+(?:/[^/]+)*".join(re.escape(p) for p in parts) + "$")

    probe = re.sub(r"\{[^}]*\}", "x", name)
    return any(pattern(key).match(probe) for key in METRICS)


def render() -> str:
    lines = [
        "# Metrics",
        "",
        "Every metric a run writes to `metrics.jsonl` (one JSON object per step; also wandb and TensorBoard when "
        "`trainer.logger` names them). Generated from `torchrl_post/logging/metric_names.py` by "
        "`python -m torchrl_post.logging.metric_names`; `<x>` is a part of the name the run fills in.",
        "",
    ]
    for section, title in SECTIONS.items():
        rows = [(k, v) for k, v in METRICS.items() if k.split("/", 1)[0] == section]
        if not rows:
            continue
        lines += [f"## {section}/", "", title + ".", "", "| metric | meaning |", "|---|---|"]
        lines += [f"| `{k}` | {v} |" for k, v in rows]
        lines.append("")
    return "\n".join(lines)


OUT = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def main() -> None:
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
