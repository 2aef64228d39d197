"""Checks that need no model and no process group: enums, ranges, batch arithmetic. One line per error."""

from __future__ import annotations

import math
import typing
from dataclasses import fields, is_dataclass
from typing import Annotated, Any, Literal

from omegaconf import ListConfig

from torchrl_post.algos.rollout_correction import rs_band
from torchrl_post.config.enums import ChatTemplateName, GroupEstimator
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import ActorConfig, Config, CriticConfig
from torchrl_post.reward.judge import validate_judge


def _one_of(key: str, value: Any, allowed: tuple[str | None, ...]) -> None:
    if value not in allowed:
        names = ", ".join("null" if a is None else a for a in allowed)
        raise ConfigError(f"{key}={value!r} is not one of {names}")


def enum_fields(cls: type) -> dict[str, tuple[str | None, ...]]:
    """Field name -> the values it takes, for each enum field of schema dataclass `cls`: a field typed
    `Annotated[str, T]` takes T's values (a `Literal`), and null too where it is optional; a list's elements do."""
    out: dict[str, tuple[str | None, ...]] = {}
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        if typing.get_origin(hint) is Annotated:
            base, kind = typing.get_args(hint)[:2]
            assert typing.get_origin(kind) is Literal, f"{cls.__name__}.{name}: Annotated with {kind}, not a Literal"
            out[name] = typing.get_args(kind) + ((None,) if type(None) in typing.get_args(base) else ())
    return out


def check_enums(node: Any, prefix: str = "") -> None:
    """Every enum key of the config tree against its field's `Literal` type (one line: `key=value is not one of`)."""
    allowed = enum_fields(type(node))
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            check_enums(value, f"{key}.")
        elif f.name in allowed:
            for item in value if isinstance(value, (list, tuple, ListConfig)) else [value]:
                _one_of(key, item, allowed[f.name])


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")


def _entropy_control(actor: ActorConfig) -> None:
    """The keys of the clip_cov and kl_cov policy losses (checked whatever actor.policy_loss is)."""
    for key in ("clip_cov_ratio", "kl_cov_ratio"):
        value = getattr(actor, key)
        if not 0 < value <= 1:
            raise ConfigError(f"actor.{key}={value} must be in (0, 1] (a fraction of the trained tokens, e.g. 0.0002)")
    if not actor.clip_cov_lb < actor.clip_cov_ub:
        raise ConfigError(
            f"actor.clip_cov_lb={actor.clip_cov_lb} must be below actor.clip_cov_ub={actor.clip_cov_ub} "
            "(the covariance window of clip_cov; verl's defaults are 1 and 5)"
        )
    _positive("actor.ppo_kl_coef", actor.ppo_kl_coef, allow_zero=True)


def _reward_shaping(cfg: Config) -> None:
    """reward.overlong_buffer (its buffer inside its maximum length) and reward.clip."""
    ob = cfg.reward.overlong_buffer
    if ob.enable:
        _positive("reward.overlong_buffer.len", ob.len)
        _positive("reward.overlong_buffer.penalty_factor", ob.penalty_factor, allow_zero=True)
        if ob.max_response_length is not None:
            _positive("reward.overlong_buffer.max_response_length", ob.max_response_length)
        longest = ob.max_response_length or cfg.data.max_response_length
        if ob.len > longest:
            raise ConfigError(
                f"reward.overlong_buffer.len={ob.len} must be <= the maximum length {longest} "
                "(reward.overlong_buffer.max_response_length, else data.max_response_length)"
            )
    if cfg.reward.clip is not None:
        _positive("reward.clip", cfg.reward.clip)


def _reward_sources(cfg: Config) -> None:
    """reward.weights against the sources that are on, the judge's keys, the reward model's (reward/mixing.py)."""
    rm, judge = cfg.reward_model, cfg.reward.judge
    given = {k: v for k, v in vars(cfg.reward.weights).items() if v is not None}
    for source, on, how in (
        ("reward_model", rm.enable, "reward_model.enable=true reward_model.model.path=..."),
        ("judge", judge.enable, "reward.judge.enable=true reward.judge.model=..."),
    ):
        if given.get(source) is not None and not on:
            raise ConfigError(
                f"reward.weights.{source} is set but that source is off; turn it on ({how}) or drop its weight"
            )
    if given and not any(given.values()):
        raise ConfigError("reward.weights are all 0: every training score would be 0; give a source a weight")
    validate_judge(judge)
    urls = cfg.reward.server.url
    if urls is not None:
        bad = [u for u in urls if not (isinstance(u, str) and u.startswith(("http://", "https://")))]
        if not urls or bad:
            raise ConfigError(f"reward.server.url={urls!r}: give http(s) URLs, e.g. [http://rm-host:5000/get_reward]")
        if cfg.reward.function is not None:
            raise ConfigError(
                f"reward.server.url and reward.function={cfg.reward.function!r} are both set: the server gives the "
                "rule's scores; unset one"
            )
        if cfg.agent.env is not None:
            raise ConfigError(
                "reward.server.url: agent episodes (agent.env) are scored by their environment; unset one"
            )
    models = rm.enable or judge.enable
    if models and cfg.agent.env is not None and cfg.algorithm.stepwise_advantage.enable:
        raise ConfigError(
            "a reward model or judge scores an agent's whole trajectory (its transcript); with "
            "algorithm.stepwise_advantage.enable=true each turn is a row of its own: turn one of them off"
        )
    trains_rm = rm.enable and (given.get("reward_model") if given else 1.0)
    apart = isinstance(cfg.placement.reward_model, list) and isinstance(cfg.placement.rollout, list)
    if trains_rm and cfg.algorithm.rejection_sample.enable and not apart:
        raise ConfigError(
            "algorithm.rejection_sample.enable=true drops uniform groups as they finish, before the reward model "
            "scores them (at the step): put the reward model and the rollout on ranks of their own "
            "(placement.reward_model=[...] placement.rollout=[...]: it then scores each group as it finishes), "
            "turn rejection sampling off, or set reward.weights.reward_model=0"
        )
    if rm.enable:
        _positive("reward_model.micro_batch_size_per_gpu", rm.micro_batch_size_per_gpu)
        _positive("reward_model.max_length", rm.max_length)


def file_list(key: str, value: Any, allow_none: bool = False) -> list[str]:
    """A path or list of paths -> list; None only where allowed (data.val_files)."""
    if value is None:
        if allow_none:
            return []
        raise ConfigError(f"{key} is null; give a data file path")
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not items or not all(isinstance(p, str) and p for p in items):
        raise ConfigError(f"{key}={value!r} must be a file path or a list of file paths")
    return items


def _finite(node: Any, prefix: str = "") -> None:
    """No nan or inf anywhere (Hydra reads `nan` and `inf` as floats; every range check lets nan through)."""
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            _finite(value, f"{key}.")
        items = value if isinstance(value, (list, tuple, ListConfig)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in items):
            raise ConfigError(f"{key}={value} is not a finite number")


def _schedule(role: str, cfg: ActorConfig | CriticConfig) -> None:
    """A role's lr schedule keys (lr_warmup_steps may be any integer: <= 0 hands over to the ratio)."""
    for key, of in (("min_lr_ratio", f"{role}.lr"), ("lr_warmup_steps_ratio", "the run's training steps")):
        if not 0 <= getattr(cfg, key) <= 1:
            raise ConfigError(f"{role}.{key}={getattr(cfg, key)} must be in [0, 1] (a fraction of {of})")
    _positive(f"{role}.num_cycles", cfg.num_cycles)


def _named(key: str, value: Any) -> None:
    """A key that names a column, a path or a source: a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}={value!r} must be a non-empty string")


def _rollout_correction(cfg: Config) -> None:
    """algorithm.rollout_correction.*: the levels, positive thresholds, a band that is not empty."""
    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    _positive(f"{key}.rollout_is_threshold", rc.rollout_is_threshold)
    for name in ("rollout_rs_threshold", "rollout_rs_threshold_lower", "rollout_token_veto_threshold"):
        if getattr(rc, name) is not None:
            _positive(f"{key}.{name}", getattr(rc, name))
    low, high = rs_band(rc.rollout_rs_threshold, rc.rollout_rs_threshold_lower, rc.rollout_is_threshold)
    if rc.rollout_rs is not None and low > high:
        raise ConfigError(
            f"{key}.rollout_rs_threshold_lower={low:g} is above {key}.rollout_rs_threshold={high:g} (a null "
            "rollout_rs_threshold is rollout_is_threshold, a null lower end 1 / the upper), so every token would "
            "be rejected; set a lower end below the upper one"
        )
    # The engine and the trainer hold the same weights at first (and on-policy throughout), so ratios sit at 1: a
    # band without 1, or a veto above it, drops every sample and nothing trains.
    if rc.rollout_rs is not None and not low <= 1 <= high:
        side = f"{key}.rollout_rs_threshold_lower={low:g}" if low > 1 else f"{key}.rollout_rs_threshold={high:g}"
        raise ConfigError(
            f"{side}: the kept band [{low:g}, {high:g}] leaves out a ratio of 1 (the rollout engine and the trainer "
            "agreeing), so every on-policy token would be rejected; set the lower end <= 1 <= the upper end"
        )
    veto = rc.rollout_token_veto_threshold
    if veto is not None and veto >= 1:
        raise ConfigError(
            f"{key}.rollout_token_veto_threshold={veto:g} vetoes a sample with any token ratio below it, and on-policy "
            "ratios sit at 1 (below it by rounding alone), so every sample would be dropped; set it well below 1 "
            "(e.g. 1e-4) or null"
        )


def _mixture_of_experts(cfg: Config) -> None:
    """Expert parallelism's and routing replay's needs that the config alone shows (the model's own are checked by
    `preflight.check_experts`, the ranks' by the plan)."""
    for key, fsdp in (("actor.fsdp", cfg.actor.fsdp), ("critic.fsdp", cfg.critic.fsdp)):
        ep = fsdp.expert_parallel_size
        _positive(f"{key}.expert_parallel_size", ep)
    _positive("actor.router_aux_loss_coef", cfg.actor.router_aux_loss_coef, allow_zero=True)
    if not cfg.actor.router_replay:
        return
    if cfg.rollout.engine != "vllm":
        raise ConfigError(
            "actor.router_replay=true replays the vLLM engine's recorded experts: set rollout.engine=vllm"
        )
    if not cfg.rollout.return_routed_experts:
        raise ConfigError("actor.router_replay=true needs the engine's experts: set rollout.return_routed_experts=true")


def _partial_rollout(cfg: Config) -> None:
    """rollout.partial_rollout's keys and the staleness bound (one line each)."""
    r, t = cfg.rollout, cfg.trainer
    if t.max_staleness is not None:
        _positive("trainer.max_staleness", t.max_staleness, allow_zero=True)
    if r.update_on_arrival and not r.partial_rollout:
        raise ConfigError(
            "rollout.update_on_arrival=true needs rollout.partial_rollout=true (whole batches take the weights "
            "between batches); set rollout.partial_rollout=true or rollout.update_on_arrival=false"
        )
    # Batches filled ahead are that stale when taken, whole batches (fill_policy passes the bound to both) or not.
    if t.max_staleness is not None and t.max_staleness < t.max_off_policy_steps:
        raise ConfigError(
            f"trainer.max_staleness={t.max_staleness} is below trainer.max_off_policy_steps="
            f"{t.max_off_policy_steps}, the staleness of every batch filled ahead: it would drop them all; "
            f"set it to {t.max_off_policy_steps} or more (or null)"
        )
    if not r.partial_rollout:
        return
    if r.prompts_in_flight is not None and r.prompts_in_flight < cfg.data.train_batch_size:
        raise ConfigError(
            f"rollout.prompts_in_flight={r.prompts_in_flight} is less than a step's data.train_batch_size="
            f"{cfg.data.train_batch_size}: keep at least a batch in flight (null: "
            f"{max(t.max_off_policy_steps + 1, 2)} x the batch)"
        )


def _distillation(cfg: Config) -> None:
    """distillation.*: a teacher to distil from, a loss that can train, sane weights (one line each)."""
    d = cfg.distillation
    if not d.enable:
        return
    if d.teacher.path is None:
        raise ConfigError(
            "distillation.enable=true needs distillation.teacher.path=<the teacher's HF checkpoint> (a causal LM with "
            "the policy's tokenizer)"
        )
    _named("distillation.teacher.path", d.teacher.path)
    _positive("distillation.distillation_loss_coef", d.distillation_loss_coef, allow_zero=True)
    _positive("distillation.topk", d.topk)
    _positive("distillation.teacher.log_prob_micro_batch_size_per_gpu", d.teacher.log_prob_micro_batch_size_per_gpu)
    if d.loss_max_clamp is not None:
        _positive("distillation.loss_max_clamp", d.loss_max_clamp)
    if d.loss_mode == "k1" and not d.use_policy_gradient:
        raise ConfigError(
            "distillation.loss_mode=k1 with use_policy_gradient=false has no gradient toward the teacher (k1's "
            "derivative is 1 whatever the teacher says): use k3 (or k2), or use_policy_gradient=true"
        )


def _sft(cfg: Config) -> None:
    """sft.enable: what an SFT run has no use for is refused, one line each (rather than trained past)."""
    if not cfg.sft.enable:
        return
    _named("sft.response_key", cfg.sft.response_key)
    _named("sft.messages_key", cfg.sft.messages_key)
    refused = {
        "reward_model.enable=true": cfg.reward_model.enable,
        "reward.judge.enable=true": cfg.reward.judge.enable,
        "actor.use_kl_loss=true": cfg.actor.use_kl_loss,
        "algorithm.use_kl_in_reward=true": cfg.algorithm.use_kl_in_reward,
        "agent.env": cfg.agent.env is not None,
        "trainer.max_off_policy_steps > 0": cfg.trainer.max_off_policy_steps > 0,
        "distillation.enable=true": cfg.distillation.enable,
    }
    for key, on in refused.items():
        if on:
            raise ConfigError(
                f"sft.enable=true trains on the data's responses with no engine, reward or critic: drop {key}, or "
                "run RL from the SFT checkpoint (docs/sft.md)"
            )


def validate(cfg: Config) -> None:
    """World-size independent checks (placement and per-rank arithmetic: `validate_batch`)."""
    _finite(cfg)
    check_enums(cfg)
    _sft(cfg)
    _distillation(cfg)
    _named("model.path", cfg.model.path)
    for key in ("prompt_key", "answer_key", "data_source_key", "default_data_source"):
        _named(f"data.{key}", getattr(cfg.data, key))
    _named("trainer.default_local_dir", cfg.trainer.default_local_dir)
    if cfg.critic.model.path is not None:
        _named("critic.model.path", cfg.critic.model.path)
    file_list("data.train_files", cfg.data.train_files)
    file_list("data.val_files", cfg.data.val_files, allow_none=True)
    for key in ("train_batch_size", "max_prompt_length", "max_response_length"):
        _positive(f"data.{key}", getattr(cfg.data, key))
    _positive("data.val_batch_size", cfg.data.val_batch_size, allow_zero=True)
    _positive("rollout.n", cfg.rollout.n)
    _positive("rollout.temperature", cfg.rollout.temperature, allow_zero=True)
    v = cfg.rollout.val_kwargs
    _positive("rollout.val_kwargs.n", v.n)
    _positive("rollout.val_kwargs.temperature", v.temperature, allow_zero=True)
    if not 0 < v.top_p <= 1:
        raise ConfigError(f"rollout.val_kwargs.top_p={v.top_p} must be in (0, 1]")
    _positive("trainer.log_val_generations", cfg.trainer.log_val_generations, allow_zero=True)
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p={cfg.rollout.top_p} must be in (0, 1]")
    _positive("rollout.tensor_parallel_size", cfg.rollout.tensor_parallel_size)
    _positive("model.ulysses_sequence_parallel_size", cfg.model.ulysses_sequence_parallel_size)
    _positive(
        "algorithm.rejection_sample.max_extra_rounds", cfg.algorithm.rejection_sample.max_extra_rounds, allow_zero=True
    )
    _rollout_correction(cfg)
    _positive("trainer.max_off_policy_steps", cfg.trainer.max_off_policy_steps, allow_zero=True)
    _partial_rollout(cfg)
    _positive("rollout.sync_bucket_mb", cfg.rollout.sync_bucket_mb)
    _positive("actor.lr", cfg.actor.lr)
    _positive("actor.ppo_epochs", cfg.actor.ppo_epochs)
    _positive("actor.ppo_micro_batch_size_per_gpu", cfg.actor.ppo_micro_batch_size_per_gpu)
    _positive("actor.ppo_mini_batch_size", cfg.actor.ppo_mini_batch_size, allow_zero=True)
    _positive("actor.gradient_accumulation_steps", cfg.actor.gradient_accumulation_steps, allow_zero=True)
    _schedule("actor", cfg.actor)
    _positive("actor.clip_ratio", cfg.actor.clip_ratio)
    if len(cfg.actor.betas) != 2 or not all(0 <= b < 1 for b in cfg.actor.betas):
        raise ConfigError(f"actor.betas={cfg.actor.betas} must be two numbers in [0, 1) like [0.9,0.999]")
    _positive("actor.weight_decay", cfg.actor.weight_decay, allow_zero=True)
    for side in ("clip_ratio_low", "clip_ratio_high"):
        if getattr(cfg.actor, side) is not None:
            _positive(f"actor.{side}", getattr(cfg.actor, side), allow_zero=True)
    if cfg.actor.use_dynamic_bsz:
        _positive("actor.ppo_max_token_len_per_gpu", cfg.actor.ppo_max_token_len_per_gpu)
    _positive("rollout.max_num_seqs", cfg.rollout.max_num_seqs)
    if cfg.rollout.gpu_memory_utilization is not None and not 0 < cfg.rollout.gpu_memory_utilization <= 1:
        raise ConfigError(f"rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} must be in (0, 1]")
    est = cfg.algorithm.adv_estimator
    if est in ("grpo", "rloo") and cfg.rollout.n < 2:
        raise ConfigError(
            f"rollout.n=1 with algorithm.adv_estimator={est} gives every sample zero advantage; set rollout.n >= 2"
        )
    if cfg.actor.clip_ratio_c is not None and cfg.actor.clip_ratio_c <= 1:
        raise ConfigError(f"actor.clip_ratio_c={cfg.actor.clip_ratio_c} must be > 1 (or null to turn dual clip off)")
    _entropy_control(cfg.actor)
    if cfg.algorithm.kl_ctrl.type == "adaptive":
        _positive("algorithm.kl_ctrl.target_kl", cfg.algorithm.kl_ctrl.target_kl)
        _positive("algorithm.kl_ctrl.horizon", cfg.algorithm.kl_ctrl.horizon)
    if cfg.algorithm.advantage_clip is not None:
        _positive("algorithm.advantage_clip", cfg.algorithm.advantage_clip)
    if not 0 <= cfg.algorithm.gamma <= 1 or not 0 <= cfg.algorithm.lam <= 1:
        raise ConfigError(
            f"algorithm.gamma={cfg.algorithm.gamma} and algorithm.lam={cfg.algorithm.lam} must be in [0, 1]"
        )
    _positive("critic.lr", cfg.critic.lr)
    _positive("critic.weight_decay", cfg.critic.weight_decay, allow_zero=True)
    _schedule("critic", cfg.critic)
    if cfg.critic.cliprange_value is not None:
        _positive("critic.cliprange_value", cfg.critic.cliprange_value)
    _positive("critic.ppo_micro_batch_size_per_gpu", cfg.critic.ppo_micro_batch_size_per_gpu)
    _positive("reference.log_prob_micro_batch_size_per_gpu", cfg.reference.log_prob_micro_batch_size_per_gpu)
    a = cfg.agent
    if (a.env is None) != (a.agent is None):
        raise ConfigError("agent.env and agent.agent go together: set both (package.module:Class) or neither")
    if a.env is not None:
        for key, value in (("agent.env", a.env), ("agent.agent", a.agent)):
            if ":" not in str(value):
                raise ConfigError(f"{key}={value!r} must look like package.module:Class")
        if not isinstance(a.tools, (list, tuple, ListConfig)) or not all(isinstance(t, str) for t in a.tools):
            raise ConfigError(f"agent.tools={a.tools!r} must be a list of tool names or package.module:function")
        _positive("agent.env_workers", a.env_workers, allow_zero=True)
        _positive("agent.max_turns", a.max_turns)
        _positive("agent.max_tokens_per_turn", a.max_tokens_per_turn, allow_zero=True)
        _positive("agent.timeout_s", a.timeout_s)
    _positive("rollout.limit_images", cfg.rollout.limit_images)
    names, template = typing.get_args(ChatTemplateName), cfg.data.chat_template
    if template is not None and template not in names and not str(template).endswith(".jinja"):
        raise ConfigError(
            f"data.chat_template={template!r} is neither one of {', '.join(names)} nor a path to a .jinja file "
            "(null: the tokenizer's own)"
        )
    if not cfg.data.image_key:
        raise ConfigError("data.image_key is empty; name the column that lists each row's images (verl: images)")
    m = cfg.model
    _positive("model.lora_rank", m.lora_rank, allow_zero=True)
    if m.lora_rank > 0 and cfg.rollout.lora_sync == "adapter" and cfg.rollout.engine != "vllm":
        raise ConfigError("rollout.lora_sync=adapter needs rollout.engine=vllm (its LoRA support); use merged")
    if m.lora_rank > 0:
        _positive("model.lora_alpha", m.lora_alpha)
        if not 0 <= m.lora_dropout < 1:
            raise ConfigError(f"model.lora_dropout={m.lora_dropout} must be in [0, 1)")
        targets = m.target_modules
        if not (
            isinstance(targets, str)
            or (isinstance(targets, (list, tuple, ListConfig)) and targets and all(isinstance(t, str) for t in targets))
        ):
            raise ConfigError(f"model.target_modules={targets!r} must be all-linear or a list of module names")
    _mixture_of_experts(cfg)
    sw = cfg.algorithm.stepwise_advantage
    if sw.enable and a.env is None:
        raise ConfigError("algorithm.stepwise_advantage.enable=true trains agent steps: set agent.env and agent.agent")
    grouped = typing.get_args(GroupEstimator)
    if sw.enable and cfg.algorithm.adv_estimator not in grouped:
        raise ConfigError(
            f"algorithm.stepwise_advantage works with algorithm.adv_estimator in {', '.join(grouped)} "
            f"(outcome advantages per trajectory or step), not {cfg.algorithm.adv_estimator!r}"
        )
    if cfg.reward.function is not None and ":" not in cfg.reward.function:
        raise ConfigError(f"reward.function={cfg.reward.function!r} must look like package.module:function")
    _reward_shaping(cfg)
    _reward_sources(cfg)
    t = cfg.trainer
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoints/global_step_N>")
    _positive("trainer.total_epochs", t.total_epochs)
    if t.total_training_steps is not None:
        _positive("trainer.total_training_steps", t.total_training_steps)
    _positive("trainer.max_nonfinite_skips", t.max_nonfinite_skips)
    _positive("trainer.wait_timeout_s", t.wait_timeout_s)
    if t.max_ckpt_to_keep is not None:
        _positive("trainer.max_ckpt_to_keep", t.max_ckpt_to_keep)


def validate_placement(cfg: Config, ranks: dict[str, list[int]], colocated: dict[str, bool]) -> None:
    """What the placement must satisfy beyond its rank lists: tensor-parallel and FSDP sizes, async needs."""
    tp, n_roll = cfg.rollout.tensor_parallel_size, len(ranks["rollout"])
    if n_roll % tp:
        raise ConfigError(
            f"rollout.tensor_parallel_size={tp} does not divide the {n_roll} rollout ranks {ranks['rollout']}; "
            f"use a divisor of {n_roll} or place a multiple of {tp} ranks in placement.rollout"
        )
    if cfg.rollout.engine == "hf" and not colocated["rollout"]:
        raise ConfigError("rollout.engine=hf runs on the actor's ranks; set placement.rollout=actor or use vllm")
    if cfg.rollout.engine == "hf" and tp > 1:
        raise ConfigError("rollout.tensor_parallel_size > 1 needs rollout.engine=vllm")
    steps = cfg.trainer.max_off_policy_steps
    if steps > 0 and colocated["rollout"]:
        raise ConfigError(
            f"trainer.max_off_policy_steps={steps} needs the rollout on ranks of its own (placement.rollout=[...] "
            "disjoint from placement.actor); colocated ranks cannot generate and train at once (0 is on-policy)"
        )
    for role, fsdp in (("actor", cfg.actor.fsdp), ("critic", cfg.critic.fsdp)):
        n = len(ranks.get(role, []))
        if n and fsdp.fsdp_size > 0 and n % fsdp.fsdp_size:
            raise ConfigError(
                f"{role}.fsdp.fsdp_size={fsdp.fsdp_size} does not divide the {n} {role} ranks; "
                f"use a divisor of {n} (or -1 to shard over all of them)"
            )
    _sequence_parallel(cfg, ranks)


def _sequence_parallel(cfg: Config, ranks: dict[str, list[int]]) -> None:
    """model.ulysses_sequence_parallel_size against every role it splits rows for: it divides their ranks and
    each HSDP replica (an sp group never straddles two replicas)."""
    sp = cfg.model.ulysses_sequence_parallel_size
    if sp == 1:
        return
    key = f"model.ulysses_sequence_parallel_size={sp}"
    fsdp = {"actor": cfg.actor.fsdp, "critic": cfg.critic.fsdp, "reference": cfg.actor.fsdp}
    for role in ("actor", "critic", "reference"):
        n = len(ranks.get(role, []))
        if n and n % sp:
            raise ConfigError(
                f"{key} does not divide the {n} {role} ranks {ranks[role]}; use a divisor of {n} "
                f"or place a multiple of {sp} ranks in placement.{role}"
            )
        size = fsdp[role].fsdp_size
        if n and 0 < size < n and size % sp:
            what = "actor.fsdp" if role == "reference" else f"{role}.fsdp"
            raise ConfigError(
                f"{key} does not divide {what}.fsdp_size={size} (ranks per HSDP replica, sp groups included); "
                f"use a multiple of {sp}"
            )


def mini_batch_prompts(cfg: Config, actor_dp: int) -> int:
    """Prompts per optimizer step: actor.ppo_mini_batch_size (0: the train batch), or, with
    actor.gradient_accumulation_steps, micro-batch x steps samples per data-parallel group (ROLL's and TRL's unit)."""
    a = cfg.actor
    if not a.gradient_accumulation_steps:
        return a.ppo_mini_batch_size or cfg.data.train_batch_size
    if a.ppo_mini_batch_size:
        raise ConfigError(
            f"actor.gradient_accumulation_steps={a.gradient_accumulation_steps} and actor.ppo_mini_batch_size="
            f"{a.ppo_mini_batch_size} both size the optimizer step; keep one of them"
        )
    samples = a.ppo_micro_batch_size_per_gpu * a.gradient_accumulation_steps * actor_dp
    if samples % cfg.rollout.n:
        raise ConfigError(
            f"actor.ppo_micro_batch_size_per_gpu={a.ppo_micro_batch_size_per_gpu} x actor.gradient_accumulation_steps="
            f"{a.gradient_accumulation_steps} x {actor_dp} data-parallel ranks = {samples} samples per optimizer step, "
            f"not whole groups of rollout.n={cfg.rollout.n}; make it a multiple of {cfg.rollout.n}"
        )
    return samples // cfg.rollout.n


def validate_batch(cfg: Config, actor_dp: int, rollout_dp: int, others: dict[str, int] | None = None) -> None:
    """Batch arithmetic against the data-parallel sizes (every engine and role takes whole prompts)."""
    bsz = cfg.data.train_batch_size
    mini = mini_batch_prompts(cfg, actor_dp // cfg.model.ulysses_sequence_parallel_size)
    # (data-parallel size, what it counts): every engine and every trained/forward role takes whole prompts.
    sizes = [(actor_dp, "actor ranks"), (rollout_dp, "rollout engines")]
    sizes += [(dp, f"{role} ranks") for role, dp in (others or {}).items()]
    for dp, what in sizes:
        if bsz % dp:
            raise ConfigError(
                f"data.train_batch_size={bsz} is not divisible by the {dp} {what}; use a multiple of {dp}"
            )
    if bsz % mini:
        raise ConfigError(f"actor.ppo_mini_batch_size={mini} does not divide data.train_batch_size={bsz}")
    # An optimizer step's samples are split over the ranks (each rank's own samples, of whole groups it generated
    # or received), as verl splits a mini-batch of prompts x rollout.n over its data-parallel ranks; a step need
    # not be whole prompts per rank.
    n = cfg.rollout.n
    for dp, what in [sizes[0], *sizes[2:]]:
        if mini * n % dp:
            raise ConfigError(
                f"actor.ppo_mini_batch_size={mini} x rollout.n={n} = {mini * n} samples per optimizer step is not "
                f"divisible by the {dp} {what}; use a mini-batch whose samples split evenly over them"
            )
