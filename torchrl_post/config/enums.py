"""The allowed values of the config's enum keys, as `Literal` types: the one source of them.

The schema's fields carry them as `Annotated[str, Type]` (OmegaConf types a structured config's field by its
annotation and takes no `Literal`; it reads `Annotated[str, ...]` as `str`), the validator reads them off the
fields (`validate.check_enums`), and the code that dispatches on a key derives its tuple with `typing.get_args`.
A `Literal` nested in another is flattened by `get_args` (`DtypeOrAuto` is auto and every `Dtype`).
"""

from __future__ import annotations

from typing import Literal

Dtype = Literal["float32", "bfloat16", "float16"]
"""model.dtype, actor.fsdp.reduce_dtype (and what `auto` resolves to)."""
DtypeOrAuto = Literal["auto", Dtype]
"""rollout.dtype, actor.fsdp.param_dtype: `auto` by device (config/precision.py)."""
ModelLoadFormat = Literal["sharded", "full"]
"""model.load_format (workers/loading.py)."""
ExpertsImplementation = Literal["auto", "eager", "grouped_mm", "batched_mm"]
"""model.experts_implementation: `auto` or a name transformers' from_pretrained takes (workers/models.py)."""
Truncation = Literal["error", "left", "right", "middle"]
"""data.truncation (data/dataset.py: truncate_prompt): verl's names."""
SftTruncation = Literal["error", "right"]
"""sft.truncation (data/sft.py): a response over data.max_response_length refused, or cut and counted."""
DistillLoss = Literal["k1", "k2", "k3", "abs", "mse", "forward_kl_topk"]
"""distillation.loss_mode (algos/distill.py): verl's names."""
ChatTemplateName = Literal["chatml", "qwen2_5", "llama3", "base", "empty"]
"""The names data.chat_template takes besides a .jinja path (data/chat_templates.py: TEMPLATES)."""
Engine = Literal["vllm", "hf"]
"""rollout.engine (engines/build.py: build_engine)."""
RolloutMode = Literal["sync", "async"]
"""rollout.mode: verl's and rLLM's key, accepted as they mean it; both run the same rollout."""
EngineLoadFormat = Literal["dummy", "auto"]
"""rollout.load_format (vLLM's load_format)."""
InflightUpdate = Literal["keep", "recompute"]
"""rollout.inflight_update (rollout/inflight.py)."""
LoraSyncMode = Literal["merged", "adapter"]
"""rollout.lora_sync (sync/lora.py)."""
LrSchedulerType = Literal["constant", "cosine"]
"""actor.lr_scheduler_type, critic.lr_scheduler_type (algos/lr_schedule.py)."""
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""actor.loss_agg_mode, critic.loss_agg_mode (algos/policy_loss.py: agg_loss)."""
PolicyLoss = Literal["vanilla", "gspo", "clip_cov", "kl_cov"]
"""actor.policy_loss (algos/policy_loss.py: policy_loss)."""
KLKind = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
"""actor.kl_loss_type, algorithm.kl_penalty (algos/kl.py: kl_penalty): verl's names."""
KLControl = Literal["fixed", "adaptive"]
"""algorithm.kl_ctrl.type (trainer.py: the controller it builds)."""
GroupEstimator = Literal["grpo", "rloo"]
"""The estimators that compare a group's samples (algos/advantages.py: group_advantages)."""
AdvEstimator = Literal["grpo", "gae", "reinforce", "reinforce_plus_plus", "rloo"]
"""algorithm.adv_estimator (algos/estimators.py: compute_advantages)."""
StepwiseMode = Literal["broadcast", "per_step"]
"""algorithm.stepwise_advantage.mode (algos/stepwise.py)."""
ISLevel = Literal["token", "sequence"]
"""The importance-weight levels (algos/rollout_correction.py)."""
RolloutIS = Literal["auto", ISLevel]
"""algorithm.rollout_correction.rollout_is (null: none; auto: resolved by plan.rollout_correction)."""
RSLevel = Literal["token", "sequence", "geometric"]
"""algorithm.rollout_correction.rollout_rs (null: no rejection)."""
ResumeMode = Literal["auto", "disable", "resume_path"]
"""trainer.resume_mode (loop.py: resume)."""
Logger = Literal["console", "wandb", "tensorboard"]
"""Each of trainer.logger (logging/metrics.py)."""
Defaults = Literal["torchrl_post", "verl", "roll", "trl", "openrlhf"]
"""trainer.defaults_from: whose defaults the config started from (configs/<name>.yaml; config/load.py picks one)."""
RewardCombine = Literal["sum_then_normalize", "normalize_then_sum"]
"""reward.combine (reward/mixing.py)."""
JudgeParser = Literal["number", "boxed", "label"]
"""reward.judge.parser (reward/judge.py: parse_score)."""
JudgeOnError = Literal["zero", "skip_group"]
"""reward.judge.on_error."""
Device = Literal["auto", "cpu", "cuda"]
"""trainer.device (distributed/env.py: resolve_device_type)."""
