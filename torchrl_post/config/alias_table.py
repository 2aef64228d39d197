"""The alias table: verl / rLLM / ROLL / TRL / OpenRLHF / SkyRL keys and what each is here (the single source of docs/aliases.md).

A row is one of five kinds: `rename` (their key is our key, its value converted where the values differ), `same`
(the same name here: documented, nothing to rewrite), `noop` (accepted where its value changes nothing here, else
refused), `refused` (no equivalent: the text names what to use instead) and `combined` (two of their keys make one
of ours; `aliases.py` joins them). `subtree` rows map every key under theirs to the same key under ours.
The rewriting is in `config/aliases.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["rename", "same", "noop", "refused", "combined"]
SOURCES = ("verl", "rLLM", "ROLL", "TRL", "OpenRLHF", "SkyRL")


class Refused(Exception):
    """A value with no equivalent here; the message names what to use instead."""


@dataclass(frozen=True)
class Alias:
    source: str
    """One of SOURCES."""
    key: str
    """Their dotted key (the root of a subtree when `subtree`)."""
    kind: Kind
    ours: str = ""
    """Our key (the root of our subtree when `subtree`); empty for noop and refused rows."""
    note: str = ""
    """What differs, for the docs (and the run's note when a value is converted)."""
    convert: Callable[[Any], Any] | None = None
    """Their value -> ours; raises Refused for a value with no equivalent."""
    accepts: Callable[[Any], bool] | None = None
    """noop rows: the values that change nothing here (None: every value)."""
    noop: str = ""
    """noop rows: why nothing changes."""
    refuse: str = ""
    """refused rows, and noop rows' other values: what to use instead (one line)."""
    subtree: bool = False
    also: tuple[tuple[str, str], ...] = ()
    """Overrides this alias implies besides its own (our key, value text)."""
    shared: tuple[str, ...] = ()
    """Other sources whose key this is too, with the same meaning (ROLL's and TRL's `max_steps`): a key of several
    sources does not say whose defaults a command line wants (config/aliases.py: written_in)."""


@dataclass(frozen=True)
class Concept:
    """A row of the docs for something of theirs that has no key (or no one key)."""

    theirs: str
    ours: str
    note: str = ""


def render_value(v: Any) -> str:
    """A Python value as override text Hydra reads back as the same value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(render_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{render_value(x)}" for k, x in v.items()) + "}"
    s = str(v)
    plain = re.fullmatch(r"[A-Za-z_/.][A-Za-z0-9_./\-]*", s) and s.lower() not in (
        "true",
        "false",
        "null",
        "nan",
        "inf",
    )
    return s if plain else "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ---- value conversions ----------------------------------------------------------------------------------------

_DTYPES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def _dtype(v: Any) -> Any:
    """fp32 / bf16 / fp16 (verl's and ROLL's short names) -> float32 / bfloat16 / float16; others as they are."""
    return _DTYPES.get(v, v) if isinstance(v, str) else v


def _inverted(v: Any) -> bool:
    if not isinstance(v, bool):
        raise Refused("it takes true or false")
    return not v


def _engine(v: Any) -> str:
    engines = {"vllm": "vllm", "hf": "hf", "hf_infer": "hf"}
    if v not in engines:
        raise Refused(f"the engines here are vllm and hf: use rollout.engine=vllm (or hf) instead of {v}")
    return engines[v]


def _router_replay(v: Any) -> bool:
    """verl's and ROLL's router_replay.mode: R3 (rollout routing replay) is ours; R2 (the old policy's own routing
    replayed in the update) is not built."""
    modes = {"disable": False, "disabled": False, "none": False, None: False, "R3": True, "r3": True}
    if v not in modes:
        raise Refused(f"router_replay.mode={v}: only R3 (actor.router_replay=true) or disabled are built here")
    return modes[v]


def _load_format(v: Any) -> str:
    if isinstance(v, str) and v.startswith("dummy"):
        return "dummy"
    if v in ("auto", "hf", "safetensors"):
        return "auto"
    raise Refused("use rollout.load_format=dummy (the first weight sync fills the engine) or auto")


def _rollout_is(v: Any) -> str | None:
    """an earlier verl's algorithm.rollout_is (true: apply the weights) and this project's former values (auto, token,
    none) -> algorithm.rollout_correction.rollout_is."""
    if v is None or v is False or v == "none":
        return None
    if v is True:
        return "token"
    if v in ("auto", "token", "sequence"):
        return str(v)
    raise Refused(f"algorithm.rollout_correction.rollout_is takes token, sequence, auto or null, not {v}")


def _pg_variant(v: Any) -> str:
    if v in ("vanilla", "ppo"):
        return "vanilla"
    if v == "gspo":
        return "gspo"
    raise Refused(
        f"the policy losses here are vanilla (PPO clip), gspo, clip_cov and kl_cov: use actor.policy_loss=vanilla, "
        f"not {v}"
    )


def _resume(v: Any) -> dict[str, Any]:
    """ROLL's and TRL's resume_from_checkpoint: false / None start fresh, true the latest checkpoint of the run
    directory, a string that checkpoint (several keys here)."""
    if v is None or v is False:
        return {"trainer.resume_mode": "disable"}
    if v is True:
        return {"trainer.resume_mode": "auto"}
    if isinstance(v, str) and v:
        return {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": v}
    raise Refused("it takes false, true (the latest checkpoint) or a checkpoint directory")


def _no_cap(v: Any) -> Any:
    """TRL's max_steps: -1 (its default) trains num_train_epochs epochs; here null."""
    return None if isinstance(v, int) and v < 0 else v


def _loggers(v: Any) -> list[str]:
    names = v if isinstance(v, list) else [v]
    return ["console" if n == "stdout" else n for n in names]


def _lora_target(v: Any) -> Any:
    """ROLL's comma-separated module names -> a list; all-linear as it is."""
    if isinstance(v, str) and v != "all-linear":
        return [m.strip() for m in v.split(",") if m.strip()]
    return v


def _template(v: Any) -> Any:
    """ROLL's data_args.template: native (and qwen3, whose template is the tokenizer's own) is null, the tokenizer's
    own chat template; another name is ours (data.chat_template checks it)."""
    return None if v in (None, "native", "qwen3") else v


_MEGATRON_MODULES = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_q": ("q_proj",),
    "linear_k": ("k_proj",),
    "linear_v": ("v_proj",),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc1_gate": ("gate_proj",),
    "linear_fc1_up": ("up_proj",),
    "linear_fc2": ("down_proj",),
}


def _megatron_modules(v: Any) -> Any:
    """verl's model.lora.target_modules name Megatron's fused layers; here the model's own (Qwen / Llama names)."""
    names = v if isinstance(v, list) else [v]
    out: list[str] = []
    for name in names:
        for module in _MEGATRON_MODULES.get(str(name), (str(name),)):
            if module not in out:
                out.append(module)
    return out


def _lora_merge(v: Any) -> str:
    if not isinstance(v, bool):
        raise Refused("it takes true (merged weights) or false (the adapter)")
    return "merged" if v else "adapter"


def _multiplier(v: Any) -> int:
    if not isinstance(v, int) or v < 1:
        raise Refused("a whole multiplier >= 1 (algorithm.rejection_sample.max_extra_rounds is it minus 1)")
    return v - 1


def _timeout(v: Any) -> dict[str, Any]:
    """rLLM's trajectory_timeout: null is no bound there; here episodes keep agent.timeout_s's bound (60 s)."""
    if v is None:
        return {}
    if not isinstance(v, (int, float)) or v <= 0:
        raise Refused("seconds > 0, or null (agent.timeout_s's 60 s bound stays)")
    return {"agent.timeout_s": float(v)}


def _extra_rounds(v: Any) -> int:
    """DAPO's max_num_gen_batches counts every generation round; ours the rounds after the first. 0 is unbounded
    there, which here would be a step that may never end."""
    if not isinstance(v, int) or v < 1:
        raise Refused("a bound of rounds >= 1; DAPO's 0 (no bound) could generate forever: give one")
    return v - 1


def _mask_truncated(v: Any) -> dict[str, Any]:
    """rLLM's mask_truncated_samples / ROLL's max_len_mask: weight 0 for answers cut at the length, nothing else."""
    if not isinstance(v, bool):
        raise Refused("it takes true or false")
    if not v:
        return {}
    flags = ("max_prompt_length_exceeded", "max_turns_exceeded", "timeout", "error", "env_done")
    return {
        "algorithm.compact_filtering.enable": True,
        "algorithm.compact_filtering.mask_max_response_length_exceeded": True,
        **{f"algorithm.compact_filtering.mask_{f}": False for f in flags},
    }


def _module_list(v: Any) -> Any:
    """TRL's lora_target_modules: argparse's tokens, which TRL's own example writes `"q_proj", "v_proj"` (a trailing
    comma on all but the last): the module names, commas dropped."""
    tokens = v if isinstance(v, list) else [v]
    names = [m.strip() for t in tokens for m in str(t).split(",") if m.strip()]
    return names[0] if names == ["all-linear"] else names


def _trl_loss_type(v: Any) -> str:
    modes = {
        "grpo": "seq-mean-token-mean",
        "dr_grpo": "seq-mean-token-sum-norm",
        "bnpo": "token-mean",
        "dapo": "token-mean",
    }
    if v not in modes:
        raise Refused(
            f"choose the aggregation itself: actor.loss_agg_mode (token-mean, seq-mean-token-mean, ...), not {v}"
        )
    return modes[v]


def _trl_scale_rewards(v: Any) -> bool:
    if v in (True, "group"):
        return True
    if v in (False, "none"):
        return False
    raise Refused("advantages are scaled by each group's std here: algorithm.norm_adv_by_std_in_grpo=true (or false)")


def _trl_engine(v: Any) -> str:
    if not isinstance(v, bool):
        raise Refused("it takes true or false; the engine is rollout.engine (vllm or hf)")
    return "vllm" if v else "hf"


def _trl_top_k(v: Any) -> int:
    return -1 if v in (None, 0) else int(v)


def _trl_report_to(v: Any) -> list[str]:
    names = v if isinstance(v, list) else [v]
    return ["console", *(n for n in names if n not in ("none", None, "console"))]


_TRL_REWARDS = {
    name: f"torchrl_post.reward.builtin:{name}"
    for name in ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")
}
"""TRL's --reward_funcs names -> our built-ins of the same name (verl's signature)."""
_TRL_OVERLONG = {
    "reward.overlong_buffer.enable": True,
    "reward.overlong_buffer.len": 256,
    "reward.overlong_buffer.penalty_factor": 1.0,
    "reward.overlong_buffer.max_response_length": 1280,
}
"""TRL's registry entry get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256): DAPO's rule."""
_OVERLONG_LOG = "reward/overlong_reward and reward/overlong are logged whenever reward.overlong_buffer.enable"


def trl_reward_funcs(v: Any) -> dict[str, Any]:
    """TRL's reward_funcs (a name or a list of names) -> reward.function (and the overlong shaping)."""
    names = [str(n) for n in v] if isinstance(v, (list, tuple)) else [str(v)]
    out: dict[str, Any] = {}
    if "get_soft_overlong_punishment" in names:
        names.remove("get_soft_overlong_punishment")
        out |= _TRL_OVERLONG
        if not names:
            raise Refused(
                "get_soft_overlong_punishment is added to a reward function's score here (reward.overlong_buffer): "
                "name one with it, e.g. --reward_funcs accuracy_reward get_soft_overlong_punishment"
            )
    if len(names) > 1:
        raise Refused(
            f"TRL sums several reward functions ({', '.join(names)}); reward.function is one here: write one that "
            "returns their sum and set reward.function=package.module:function"
        )
    (name,) = names
    if name in _TRL_REWARDS:
        out["reward.function"] = _TRL_REWARDS[name]
    elif ":" in name:
        out["reward.function"] = name
    elif "." in name:
        module, _, fn = name.rpartition(".")
        out["reward.function"] = f"{module}:{fn}"
    else:
        raise Refused(
            f"the built-in reward functions are {', '.join(_TRL_REWARDS)} and get_soft_overlong_punishment; "
            f"else give the function's import path (package.module.function), not {name}"
        )
    return out


# ---- OpenRLHF's values ------------------------------------------------------------------------------------------

REMOTE_REWARD = (
    "it takes a reward function file (a .py) or reward servers' http(s) URLs, comma-separated (reward.server.url)"
)


def _orlhf_remote(v: Any) -> dict[str, Any]:
    """OpenRLHF's reward.remote_url: a .py file is a reward function file (its `reward_func`); URLs (comma-separated,
    as OpenRLHF splits them) are a reward server's (reward.server.url)."""
    if isinstance(v, str) and v.endswith(".py"):
        return {"reward.function": f"{v}:reward_func"}
    v = getattr(v, "list", v)  # `a,b` in an override is Hydra's sweep of the two: its values
    urls = [u.strip() for u in v.split(",")] if isinstance(v, str) else v
    if (
        isinstance(urls, list)
        and urls
        and all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls)
    ):
        return {"reward.server.url": urls}
    raise Refused(REMOTE_REWARD)


def _orlhf_reward_model(v: Any) -> dict[str, Any]:
    """OpenRLHF's reward.model_name_or_path: the reward model, enabled."""
    return {"reward_model.enable": v is not None, "reward_model.model.path": v}


def _eps_low_high(v: Any) -> dict[str, Any]:
    """OpenRLHF's actor.eps_clip_low_high (two numbers) -> actor.clip_ratio_low and actor.clip_ratio_high."""
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)):
        raise Refused("it takes two numbers, low and high: actor.clip_ratio_low and actor.clip_ratio_high here")
    return {"actor.clip_ratio_low": v[0], "actor.clip_ratio_high": v[1]}


_ORLHF_ESTIMATORS: dict[str, dict[str, Any]] = {
    # OpenRLHF whitens gae's, reinforce's and reinforce_baseline's advantages over the batch (experience_maker.py),
    # the others not (said explicitly: configs/openrlhf.yaml whitens, for gae); group_norm divides by the group's
    # std, dr_grpo and reinforce_baseline only subtract the group's mean
    "gae": {"algorithm.adv_estimator": "gae", "algorithm.whiten_advantages": True},
    "reinforce": {"algorithm.adv_estimator": "reinforce_plus_plus", "algorithm.whiten_advantages": True},
    "rloo": {"algorithm.adv_estimator": "rloo", "algorithm.whiten_advantages": False},
    "group_norm": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": True,
        "algorithm.whiten_advantages": False,
    },
    "dr_grpo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "algorithm.whiten_advantages": False,
    },
    "reinforce_baseline": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "algorithm.whiten_advantages": True,
    },
}


def _orlhf_estimator(v: Any) -> dict[str, Any]:
    if v not in _ORLHF_ESTIMATORS:
        raise Refused(f"the estimators here are algorithm.adv_estimator=grpo, gae, reinforce_plus_plus, rloo, not {v}")
    return _ORLHF_ESTIMATORS[v]


def _orlhf_scheduler(v: Any) -> str:
    """OpenRLHF's (transformers') scheduler names: cosine_with_min_lr is cosine down to actor.min_lr_ratio."""
    names = {
        "cosine_with_min_lr": "cosine",
        "cosine": "cosine",
        "constant": "constant",
        "constant_with_warmup": "constant",
    }
    if v not in names:
        raise Refused(f"the schedules here are actor.lr_scheduler_type=cosine (to min_lr_ratio) or constant, not {v}")
    return names[v]


def _kl_target(v: Any) -> dict[str, Any]:
    """OpenRLHF's algo.kl.target: a number is the adaptive controller's target, None the fixed coefficient."""
    if v is None:
        return {"algorithm.kl_ctrl.type": "fixed"}
    return {"algorithm.kl_ctrl.type": "adaptive", "algorithm.kl_ctrl.target_kl": v}


def _both_offloads(v: Any) -> dict[str, Any]:
    """OpenRLHF's ds.enable_sleep: the DeepSpeed states leave the GPU while vLLM generates."""
    return {"actor.fsdp.param_offload": v, "actor.fsdp.optimizer_offload": v}


def _eval_temperature(v: Any) -> dict[str, Any]:
    return {"rollout.val_kwargs.do_sample": bool(v), "rollout.val_kwargs.temperature": v}


def _load_enable(v: Any) -> str:
    if not isinstance(v, bool):
        raise Refused("it takes true (resume the run directory's latest checkpoint, trainer.resume_mode=auto) or false")
    return "auto" if v else "disable"


def _wandb_key(v: Any) -> list[str]:
    """OpenRLHF logs to wandb when its key is given; the key itself is wandb's own login here."""
    return ["console", "wandb"] if v else ["console"]


def _tensorboard_dir(v: Any) -> list[str]:
    return ["console", "tensorboard"] if v else ["console"]


def _files(v: Any) -> Any:
    """OpenRLHF's comma-separated datasets -> a list; one as it is."""
    if isinstance(v, str) and "," in v:
        return [f.strip() for f in v.split(",") if f.strip()]
    return v


def _or_default(default: Any) -> Callable[[Any], Any]:
    """None (OpenRLHF's unset) -> our value for the same thing."""
    return lambda v: default if v is None else v


def _zero_one(v: Any) -> bool:
    """OpenRLHF's dynamic filtering band (0, 1): with rewards of 0 and 1, the groups not all equal."""
    return isinstance(v, (list, tuple)) and [float(x) if isinstance(x, (int, float)) else x for x in v] == [0.0, 1.0]


# ---- value tests of noop rows -----------------------------------------------------------------------------------


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: v in values


_ONE = _is(None, 1)
_EMPTY = _is(None, {}, "{}")
_ZERO = _is(None, 0, False)
_TRUE = _is(True)
_FALSE = _is(None, False)


# ---- the table ----------------------------------------------------------------------------------------------------

V, L, R, T, OR, S = "verl", "rLLM", "ROLL", "TRL", "OpenRLHF", "SkyRL"
A = "actor_rollout_ref.actor"
M = "actor_rollout_ref.model"
RO = "actor_rollout_ref.rollout"
RF = "actor_rollout_ref.ref"
RC = "algorithm.rollout_correction"
RSC = "actor_infer.strategy_args.strategy_config"
TSC = "actor_train.strategy_args.strategy_config"

_MEGATRON = "the actor trains with FSDP2 only (no Megatron parallelism): shard it with actor.fsdp.fsdp_size"
_LAUNCHER = "torchrun --nnodes / --nproc-per-node set the world; roles go on ranks with placement.*"
_WORLD = (
    "times {} (verl's defaults 8 and 1): the ranks to plan for; refused unless it equals the world torchrun "
    "launched (--nnodes x --nproc-per-node)"
)
_SP = "one value for the actor, critic and reference"
_PY_ARGS = (
    "an agent's or environment's arguments are Python objects: api.train(cfg, agent_args=..., env_args=...) with "
    "agent.agent and agent.env"
)
_UNKNOWN_REASON = "episodes end for a named reason here; choose which get weight 0 with algorithm.compact_filtering.*"
_MODEL_TYPE = "model.path is loaded as a causal LM (a value model is the critic's: critic.model.path)"
_BEAMS = "beam search is not built: answers are sampled (rollout.temperature, rollout.top_p)"
_ROLL_ENVS = (
    "ROLL's environments and their managers are ROLL's classes; an agent here is a Python environment class "
    "(agent.env=package.module:Class, agent.agent=...; docs/agents.md)"
)
_LOGPROB_MB = "the actor's old-logprob forward uses actor.ppo_micro_batch_size_per_gpu micro-batches (memory only)"


def _rename(source: str, key: str, ours: str, note: str = "", **kw: Any) -> Alias:
    return Alias(source, key, "rename", ours, note, **kw)


def _same(source: str, key: str, note: str = "") -> Alias:
    return Alias(source, key, "same", key, note)


def _noop(
    source: str,
    key: str,
    why: str,
    accepts: Callable[[Any], bool] | None = None,
    refuse: str = "",
    subtree: bool = False,
) -> Alias:
    return Alias(source, key, "noop", noop=why, accepts=accepts, refuse=refuse, subtree=subtree)


def _refused(source: str, key: str, instead: str, subtree: bool = False) -> Alias:
    return Alias(source, key, "refused", refuse=instead, subtree=subtree)


ALIASES: tuple[Alias, ...] = (
    # ---- verl: data and algorithm keys have our names -------------------------------------------------------------
    _same(V, "data.train_files", "a path or a list: .json, .jsonl, .csv, .parquet"),
    _same(V, "data.val_files"),
    _same(V, "data.prompt_key", "a `messages` column is used if absent"),
    _same(V, "data.train_batch_size", "prompts per step"),
    _same(V, "data.val_batch_size"),
    _same(V, "data.max_prompt_length"),
    _same(V, "data.max_response_length"),
    _same(V, "data.filter_overlong_prompts"),
    _same(V, "data.shuffle"),
    _same(V, "data.image_key"),
    _same(V, "data.return_multi_modal_inputs"),
    _rename(V, "data.reward_fn_key", "data.data_source_key"),
    _noop(
        V,
        "data.return_raw_chat",
        "it only shapes verl's batch; here the prompts are templated once when the data loads and agents get the question",
    ),
    _same(V, "data.truncation", "error, left, right or middle: the prompts data.filter_overlong_prompts=false keeps"),
    _same(V, "algorithm.adv_estimator", "grpo, gae, reinforce, reinforce_plus_plus, rloo"),
    _same(V, "algorithm.norm_adv_by_std_in_grpo"),
    _same(V, "algorithm.gamma"),
    _same(V, "algorithm.lam"),
    _same(V, "algorithm.use_kl_in_reward"),
    _same(V, "algorithm.kl_penalty"),
    _same(V, "algorithm.kl_ctrl.type"),
    _same(V, "algorithm.kl_ctrl.kl_coef"),
    _same(V, "algorithm.kl_ctrl.target_kl"),
    _same(V, "algorithm.kl_ctrl.horizon"),
    _same(
        V, f"{RC}.rollout_is", "token, sequence or null; auto (the default here): token with an off-policy look-ahead"
    ),
    _same(V, f"{RC}.rollout_is_threshold"),
    _same(V, f"{RC}.rollout_rs", "token, sequence, geometric or null (verl's later token_k1 / seq_* names are not)"),
    _same(V, f"{RC}.rollout_rs_threshold", "a number (verl's later 'lower_upper' strings are not)"),
    _same(V, f"{RC}.rollout_rs_threshold_lower"),
    _same(V, f"{RC}.rollout_token_veto_threshold"),
    _noop(
        V,
        f"{RC}.rollout_is_batch_normalize",
        "the weights are not renormalised here",
        _FALSE,
        f"the weights are used as they are: leave it out and bound them with {RC}.rollout_is_threshold",
    ),
    _rename(
        V,
        "algorithm.rollout_is",
        f"{RC}.rollout_is",
        "an earlier verl's key and this project's before the section: true is token (verl took the level from "
        "rollout_is_level), false and none are null",
        convert=_rollout_is,
    ),
    _rename(V, "algorithm.rollout_is_threshold", f"{RC}.rollout_is_threshold", "an earlier verl's, and ours before"),
    _rename(V, "algorithm.rollout_is_veto_threshold", f"{RC}.rollout_token_veto_threshold", "an earlier verl's"),
    _refused(
        V,
        "algorithm.rollout_is_level",
        f"an earlier verl's level is {RC}.rollout_is (truncate mode) or {RC}.rollout_rs (mask mode) here",
    ),
    _refused(
        V,
        "algorithm.rollout_is_mode",
        f"truncate is {RC}.rollout_is=token (or sequence), mask is {RC}.rollout_rs=token (or sequence, geometric)",
    ),
    _refused(
        V,
        "algorithm.rollout_is_threshold_lower",
        f"an earlier verl's mask-mode lower bound is {RC}.rollout_rs_threshold_lower",
    ),
    _noop(
        V,
        f"{A}.tis_imp_ratio_cap",
        "-1 (or null) is no truncated importance sampling",
        _is(None, -1),
        f"a cap turns on token-level truncated importance sampling: {RC}.rollout_is=token "
        f"{RC}.rollout_is_threshold=(the cap)",
    ),
    _noop(
        V,
        "async_training.staleness_threshold",
        "0 is on-policy, as here by default",
        _ZERO,
        "verl's is a share of stale samples; here staleness is counted in policy versions: "
        "trainer.max_off_policy_steps=k fills k batches ahead, and with rollout.partial_rollout=true "
        "trainer.max_staleness=k drops groups more than k versions old",
    ),
    _rename(
        V,
        "async_training.partial_rollout",
        "rollout.partial_rollout",
        "unfinished requests carry on across weight updates, in-process (no pause/resume calls)",
    ),
    # ---- verl: the model --------------------------------------------------------------------------------------------
    _rename(V, f"{M}.path", "model.path", "a local HF directory: nothing is downloaded"),
    _rename(V, f"{M}.trust_remote_code", "model.trust_remote_code"),
    _rename(V, f"{M}.enable_gradient_checkpointing", "model.enable_gradient_checkpointing"),
    _rename(V, f"{M}.use_remove_padding", "model.use_remove_padding", "sequence packing: actor, reference, critic"),
    _rename(V, f"{M}.lora_rank", "model.lora_rank"),
    _rename(V, f"{M}.lora_alpha", "model.lora_alpha"),
    _rename(V, f"{M}.target_modules", "model.target_modules"),
    _rename(V, f"{M}.lora.rank", "model.lora_rank", "verl's newer LoRA section"),
    _rename(V, f"{M}.lora.alpha", "model.lora_alpha"),
    _rename(V, f"{M}.lora.dropout", "model.lora_dropout"),
    _rename(
        V,
        f"{M}.lora.target_modules",
        "model.target_modules",
        "Megatron's module names become the model's own (linear_qkv is q_proj, k_proj, v_proj)",
        convert=_megatron_modules,
    ),
    _rename(V, f"{M}.lora.merge", "rollout.lora_sync", "true: merged, false: adapter", convert=_lora_merge),
    _noop(
        V,
        f"{M}.lora.type",
        "PEFT's LoRA",
        _is("lora", "canonical_lora"),
        "LoRA here is PEFT's (model.lora_rank, model.target_modules): DoRA and vision LoRA types are not built",
    ),
    _noop(
        V,
        f"{M}.lora.lora_A_init_method",
        "PEFT initialises A with Kaiming-uniform, B with zeros",
        _is("kaiming", None),
        "the adapter starts as PEFT's (A Kaiming-uniform, B zeros): model.lora_rank sets its size",
    ),
    _noop(
        V,
        "actor_rollout_ref.hybrid_engine",
        "the engine is colocated with the actor by default (placement.rollout=actor)",
        _TRUE,
        "give the rollout ranks of its own with placement.rollout=[ranks]",
    ),
    # ---- verl: the actor --------------------------------------------------------------------------------------------
    _noop(V, f"{A}.strategy", "the actor trains with FSDP2", _is("fsdp", "fsdp2"), _MEGATRON),
    _rename(V, f"{A}.optim.lr", "actor.lr"),
    _rename(V, f"{A}.optim.weight_decay", "actor.weight_decay"),
    _rename(V, f"{A}.optim.betas", "actor.betas"),
    _rename(V, f"{A}.optim.lr_warmup_steps", "actor.lr_warmup_steps", "<= 0 (verl's -1): the ratio decides"),
    _rename(V, f"{A}.optim.lr_warmup_steps_ratio", "actor.lr_warmup_steps_ratio"),
    _rename(V, f"{A}.optim.lr_scheduler_type", "actor.lr_scheduler_type", "constant or cosine"),
    _rename(V, f"{A}.optim.warmup_style", "actor.lr_scheduler_type", "verl's former name; constant or cosine"),
    _rename(V, f"{A}.optim.min_lr_ratio", "actor.min_lr_ratio"),
    _rename(V, f"{A}.optim.num_cycles", "actor.num_cycles"),
    _rename(V, f"{A}.grad_clip", "actor.grad_clip"),
    _rename(V, f"{A}.ppo_mini_batch_size", "actor.ppo_mini_batch_size", "prompts per optimizer step, as in verl"),
    _rename(V, f"{A}.ppo_micro_batch_size_per_gpu", "actor.ppo_micro_batch_size_per_gpu"),
    _noop(
        V,
        f"{A}.ppo_micro_batch_size",
        "verl's deprecated global micro-batch sizes memory only, not the update; here per rank: "
        "actor.ppo_micro_batch_size_per_gpu (its value / the actor's ranks)",
    ),
    _rename(V, f"{A}.use_dynamic_bsz", "actor.use_dynamic_bsz"),
    _rename(V, f"{A}.ppo_max_token_len_per_gpu", "actor.ppo_max_token_len_per_gpu"),
    _rename(V, f"{A}.ppo_epochs", "actor.ppo_epochs"),
    _rename(V, f"{A}.clip_ratio", "actor.clip_ratio"),
    _rename(V, f"{A}.clip_ratio_low", "actor.clip_ratio_low"),
    _rename(V, f"{A}.clip_ratio_high", "actor.clip_ratio_high"),
    _rename(V, f"{A}.clip_ratio_c", "actor.clip_ratio_c", "dual clip; null turns it off"),
    _rename(V, f"{A}.loss_agg_mode", "actor.loss_agg_mode"),
    _rename(V, f"{A}.policy_loss.loss_mode", "actor.policy_loss", "vanilla, gspo, clip_cov or kl_cov"),
    _rename(V, f"{A}.policy_loss.clip_cov_ratio", "actor.clip_cov_ratio"),
    _rename(V, f"{A}.policy_loss.clip_cov_lb", "actor.clip_cov_lb"),
    _rename(V, f"{A}.policy_loss.clip_cov_ub", "actor.clip_cov_ub"),
    _rename(V, f"{A}.policy_loss.kl_cov_ratio", "actor.kl_cov_ratio"),
    _rename(V, f"{A}.policy_loss.ppo_kl_coef", "actor.ppo_kl_coef"),
    _rename(V, f"{A}.entropy_coeff", "actor.entropy_coeff"),
    _rename(V, f"{A}.use_kl_loss", "actor.use_kl_loss"),
    _rename(V, f"{A}.kl_loss_coef", "actor.kl_loss_coef"),
    _rename(V, f"{A}.kl_loss_type", "actor.kl_loss_type"),
    _rename(V, f"{A}.ulysses_sequence_parallel_size", "model.ulysses_sequence_parallel_size", _SP),
    _rename(V, f"{M}.ulysses_sequence_parallel_size", "model.ulysses_sequence_parallel_size", _SP),
    _rename(V, f"{RF}.ulysses_sequence_parallel_size", "model.ulysses_sequence_parallel_size", _SP),
    _rename(V, "critic.ulysses_sequence_parallel_size", "model.ulysses_sequence_parallel_size", _SP),
    _rename(
        V, f"{A}.fsdp_config.param_offload", "actor.fsdp.param_offload", "hybrid engine: off the GPU while it generates"
    ),
    _rename(V, f"{A}.fsdp_config.optimizer_offload", "actor.fsdp.optimizer_offload"),
    _noop(
        V,
        f"{A}.fsdp_config.grad_offload",
        "false is the default",
        _FALSE,
        "gradients leave the GPU with the parameters here: actor.fsdp.param_offload=true",
    ),
    _rename(
        V, f"{A}.fsdp_config.offload_policy", "actor.fsdp.offload_policy", "FSDP2 CPUOffloadPolicy; optimizer on CPU"
    ),
    _rename(V, f"{A}.fsdp_config.reshard_after_forward", "actor.fsdp.reshard_after_forward"),
    _rename(V, f"{A}.fsdp_config.fsdp_size", "actor.fsdp.fsdp_size", "HSDP when smaller than the group"),
    _rename(
        V,
        f"{A}.fsdp_config.model_dtype",
        "model.dtype",
        "actor, reference and critic; fp32/bf16/fp16 become float32/bfloat16/float16",
        convert=_dtype,
    ),
    _rename(V, f"{A}.fsdp_config.mixed_precision.param_dtype", "actor.fsdp.param_dtype", convert=_dtype),
    _rename(V, f"{A}.fsdp_config.mixed_precision.reduce_dtype", "actor.fsdp.reduce_dtype", convert=_dtype),
    _rename(V, f"{A}.router_replay.mode", "actor.router_replay", "R3 is true, disabled false", convert=_router_replay),
    _rename(V, f"{A}.megatron.expert_model_parallel_size", "actor.fsdp.expert_parallel_size", "EP over FSDP2"),
    _rename(
        V,
        f"{A}.megatron.override_transformer_config.moe_aux_loss_coeff",
        "actor.router_aux_loss_coef",
        "the load-balancing loss's weight",
    ),
    _noop(V, f"{A}.megatron.tensor_model_parallel_size", "1 is what FSDP2 does", _ONE, _MEGATRON),
    _noop(V, f"{A}.megatron.pipeline_model_parallel_size", "1 is what FSDP2 does", _ONE, _MEGATRON),
    _refused(V, f"{A}.megatron", _MEGATRON, subtree=True),
    # ---- verl: the rollout ------------------------------------------------------------------------------------------
    _rename(V, f"{RO}.name", "rollout.engine", "vllm or hf", convert=_engine),
    _rename(V, f"{RO}.mode", "rollout.mode", "sync or async; async accepted in every placement"),
    _rename(V, f"{RO}.n", "rollout.n"),
    _rename(V, f"{RO}.temperature", "rollout.temperature"),
    _rename(V, f"{RO}.top_p", "rollout.top_p"),
    _rename(V, f"{RO}.top_k", "rollout.top_k"),
    _rename(V, f"{RO}.val_kwargs", "rollout.val_kwargs", subtree=True),
    _rename(V, f"{RO}.tensor_model_parallel_size", "rollout.tensor_parallel_size"),
    _rename(V, f"{RO}.gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    _rename(V, f"{RO}.max_num_seqs", "rollout.max_num_seqs"),
    _rename(V, f"{RO}.enforce_eager", "rollout.enforce_eager"),
    _rename(V, f"{RO}.free_cache_engine", "rollout.free_cache_engine"),
    _rename(V, f"{RO}.dtype", "rollout.dtype", convert=_dtype),
    _rename(V, f"{RO}.load_format", "rollout.load_format", "dummy_dtensor/dummy_hf become dummy", convert=_load_format),
    _rename(V, f"{RO}.limit_images", "rollout.limit_images"),
    _noop(V, f"{RO}.log_prob_micro_batch_size_per_gpu", _LOGPROB_MB),
    _noop(V, f"{RO}.enable_chunked_prefill", "vLLM's own default is used (a throughput setting)"),
    _noop(V, f"{RO}.max_num_batched_tokens", "vLLM's own prefill budget is used (a throughput setting)"),
    _noop(V, f"{RO}.layered_summon", "a LoRA sync sends the merged weights or the adapter (rollout.lora_sync)"),
    _noop(V, f"{RO}.engine_kwargs", "vLLM's engine arguments are chosen here from rollout.*", subtree=True),
    _noop(V, f"{RO}.trace", "no rollout tracing backend here: metrics.jsonl and val_generations", subtree=True),
    _noop(
        V,
        f"{RO}.multi_turn.enable",
        "a multi-turn rollout is an agent here: it runs when agent.agent or agent.tools is set",
    ),
    _noop(V, f"{M}.use_fused_kernels", "the LM head's logprobs are computed in bounded chunks here, always"),
    _noop(V, f"{A}.use_torch_compile", "the trainer runs eagerly under FSDP2"),
    _noop(V, f"{RF}.log_prob_use_dynamic_bsz", "the reference's forward follows actor.use_dynamic_bsz"),
    _noop(V, f"{RF}.log_prob_max_token_len_per_gpu", "the reference's forward follows actor.ppo_max_token_len_per_gpu"),
    _noop(
        V,
        "data.gen_batch_size",
        "groups are drawn as needed: with rejection sampling (algorithm.filter_groups) a dropped group is replaced "
        "by another, at most algorithm.rejection_sample.max_extra_rounds more rounds",
    ),
    _rename(V, "algorithm.filter_groups.enable", "algorithm.rejection_sample.enable", "DAPO's dynamic sampling"),
    _rename(
        V,
        "algorithm.filter_groups.max_num_gen_batches",
        "algorithm.rejection_sample.max_extra_rounds",
        "generation rounds after the first; DAPO's 0 (unbounded) is refused",
        convert=_extra_rounds,
    ),
    _noop(
        V,
        "algorithm.filter_groups.metric",
        "a group is kept when its rewards differ (DAPO's acc and score agree on 0/1 rewards)",
        _is("acc", "score", "seq_reward", "seq_final_reward"),
        "groups are compared by their rewards (algorithm.rejection_sample.enable): acc, score, seq_reward or "
        "seq_final_reward",
    ),
    _noop(V, f"{RO}.log_prob_micro_batch_size", _LOGPROB_MB),
    _noop(V, f"{RO}.log_prob_use_dynamic_bsz", "the old-logprob forward follows actor.use_dynamic_bsz"),
    _noop(V, f"{RO}.log_prob_max_token_len_per_gpu", "the old-logprob forward follows actor.ppo_max_token_len_per_gpu"),
    _rename(V, f"{RO}.multi_turn.max_assistant_turns", "agent.max_turns"),
    _rename(V, f"{RO}.multi_turn.format", "agent.tool_parser", "vLLM's tool parsers; hermes by default"),
    _refused(
        V,
        f"{RO}.multi_turn.tool_config_path",
        "list the tools in agent.tools (built-in names or package.module:function)",
    ),
    # ---- verl: the reference and the critic -------------------------------------------------------------------------
    _rename(V, f"{RF}.log_prob_micro_batch_size_per_gpu", "reference.log_prob_micro_batch_size_per_gpu"),
    _noop(
        V,
        f"{RF}.log_prob_micro_batch_size",
        "verl's deprecated global micro-batch sizes memory only; here per rank: "
        "reference.log_prob_micro_batch_size_per_gpu (its value / the ranks)",
    ),
    _rename(V, f"{RF}.fsdp_config.param_offload", "reference.param_offload", "the reference always reshards"),
    _same(V, "critic.model.path", "null: model.path"),
    _rename(V, "critic.optim.lr", "critic.lr"),
    _rename(V, "critic.optim.weight_decay", "critic.weight_decay"),
    _rename(V, "critic.optim.lr_warmup_steps", "critic.lr_warmup_steps", "<= 0 (verl's -1): the ratio decides"),
    _rename(V, "critic.optim.lr_warmup_steps_ratio", "critic.lr_warmup_steps_ratio"),
    _rename(V, "critic.optim.lr_scheduler_type", "critic.lr_scheduler_type"),
    _rename(V, "critic.optim.warmup_style", "critic.lr_scheduler_type", "verl's former name"),
    _rename(V, "critic.optim.min_lr_ratio", "critic.min_lr_ratio"),
    _rename(V, "critic.optim.num_cycles", "critic.num_cycles"),
    _same(V, "critic.grad_clip"),
    _same(V, "critic.cliprange_value"),
    _same(V, "critic.loss_agg_mode"),
    _same(V, "critic.ppo_micro_batch_size_per_gpu"),
    _noop(V, "critic.strategy", "the critic trains with FSDP2", _is("fsdp", "fsdp2"), _MEGATRON),
    _rename(V, "critic.model.fsdp_config.param_offload", "critic.fsdp.param_offload"),
    _rename(V, "critic.model.fsdp_config.optimizer_offload", "critic.fsdp.optimizer_offload"),
    _rename(V, "critic.model.fsdp_config.offload_policy", "critic.fsdp.offload_policy"),
    _rename(V, "critic.model.fsdp_config.reshard_after_forward", "critic.fsdp.reshard_after_forward"),
    _rename(V, "critic.model.fsdp_config.fsdp_size", "critic.fsdp.fsdp_size"),
    # ---- verl: on-policy distillation and SFT ------------------------------------------------------------------------
    _rename(V, "distillation.enabled", "distillation.enable"),
    _rename(
        V,
        "distillation.distillation_loss",
        "distillation",
        "loss_mode, topk, use_policy_gradient, use_task_rewards, distillation_loss_coef and the clamps: the same names",
        subtree=True,
    ),
    _refused(
        V,
        "distillation.teacher_models",
        "one teacher per run here: give its model_path as distillation.teacher.path (docs/distillation.md)",
        subtree=True,
    ),
    _refused(V, "distillation.teacher_key", "one teacher per run here (distillation.teacher.path): not by data source"),
    _rename(V, "data.response_key", "sft.response_key", "verl's SFT trainer: the response column"),
    _rename(V, "data.multiturn.messages_key", "sft.messages_key", "verl's SFT trainer: the conversation column"),
    _noop(V, "data.multiturn.enable", "a row with sft.messages_key is a conversation, one with sft.response_key not"),
    # ---- verl: reward -----------------------------------------------------------------------------------------------
    Alias(V, "custom_reward_function.path", "combined", "reward.function", "with .name: reward.function=path:name"),
    Alias(V, "custom_reward_function.name", "combined", "reward.function", "compute_score if only .path is given"),
    _same(V, "reward_model.enable", "scores replace the rule's unless reward.weights mixes them (verl's meaning)"),
    _same(V, "reward_model.model.path", "a sequence classifier (num_labels=1) with its own tokenizer"),
    _same(V, "reward_model.model.trust_remote_code"),
    _noop(
        V,
        "reward_model.model.input_tokenizer",
        "the policy's tokenizer decodes each response; the reward model's own re-tokenises it (always, as verl does "
        "when the two differ)",
    ),
    _rename(V, "reward_model.model.fsdp_config.param_offload", "reward_model.param_offload"),
    _noop(
        V, "reward_model.model.fsdp_config", "the reward model is sharded with the actor's FSDP settings", subtree=True
    ),
    _noop(V, "reward_model.model.use_remove_padding", "the reward model runs padded forwards (right-padded rows)"),
    _noop(V, "reward_model.strategy", "the reward model is sharded with FSDP2", _is("fsdp", "fsdp2"), _MEGATRON),
    _same(V, "reward_model.micro_batch_size_per_gpu"),
    _noop(V, "reward_model.micro_batch_size", "deprecated in verl; reward_model.micro_batch_size_per_gpu sizes it"),
    _same(V, "reward_model.max_length", "a longer conversation keeps its last max_length tokens"),
    _noop(V, "reward_model.use_dynamic_bsz", "fixed micro-batches of reward_model.micro_batch_size_per_gpu"),
    _noop(V, "reward_model.forward_max_token_len_per_gpu", "fixed micro-batches (use_dynamic_bsz is not read)"),
    _noop(
        V,
        "reward_model.reward_manager",
        "naive and dapo score each sample with the reward function, as here; dapo's overlong shaping is "
        "reward.overlong_buffer (reward_model.overlong_buffer.* and reward_kwargs.overlong_buffer_cfg.* set it)",
        _is("naive", "dapo"),
        "rewards are scored per sample by reward.function (verl's naive manager; dapo's shaping: reward.overlong_buffer)",
    ),
    _rename(
        V,
        "reward_model.overlong_buffer",
        "reward.overlong_buffer",
        "DAPO's recipe: enable, len, penalty_factor; the maximum is data.max_response_length",
        subtree=True,
    ),
    _noop(V, "reward_model.overlong_buffer.log", _OVERLONG_LOG),
    _rename(
        V,
        "reward_model.reward_kwargs.overlong_buffer_cfg",
        "reward.overlong_buffer",
        "verl's DAPO reward manager: enable, len, penalty_factor",
        subtree=True,
    ),
    _noop(V, "reward_model.reward_kwargs.overlong_buffer_cfg.log", _OVERLONG_LOG),
    _rename(
        V,
        "reward_model.reward_kwargs.max_resp_len",
        "reward.overlong_buffer.max_response_length",
        "the overlong rule's maximum (null here: data.max_response_length)",
    ),
    _rename(R, "reward_clip", "reward.clip", "each score clamped to [-c, c] before advantages"),
    # ---- verl: trainer ----------------------------------------------------------------------------------------------
    _same(V, "trainer.total_epochs"),
    _same(V, "trainer.total_training_steps"),
    _same(V, "trainer.save_freq", "<= 0 turns saving off"),
    _same(V, "trainer.test_freq", "<= 0 turns validation off"),
    _same(V, "trainer.val_before_train"),
    _same(V, "trainer.val_only"),
    _same(V, "trainer.log_val_generations"),
    _same(V, "trainer.default_local_dir"),
    _same(V, "trainer.resume_mode"),
    _same(V, "trainer.resume_from_path"),
    _same(V, "trainer.logger", "console, wandb, tensorboard; metrics.jsonl always"),
    _same(V, "trainer.project_name"),
    _same(V, "trainer.experiment_name"),
    _same(V, "trainer.device"),
    _rename(V, "trainer.max_actor_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    _noop(
        V,
        "trainer.balance_batch",
        "a throughput setting: micro-batches are formed per rank (actor.use_dynamic_bsz balances them by tokens)",
    ),
    _rename(V, "trainer.max_critic_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    _rename(
        V,
        "actor_rollout_ref.nccl_timeout",
        "trainer.wait_timeout_s",
        "here a rank's silence, not a collective's length",
    ),
    _noop(
        V,
        "trainer.default_hdfs_dir",
        "null: no copy to HDFS",
        _is(None, ""),
        "the run directory (trainer.default_local_dir) is not copied anywhere; copy it after the run",
    ),
    _noop(
        V,
        "trainer.critic_warmup",
        "0 updates the actor from the first step, as here",
        _ZERO,
        "no critic warm-up here (the actor and critic update every step); to start the actor gently use actor.lr_warmup_steps",
    ),
    Alias(V, "trainer.n_gpus_per_node", "combined", "trainer.world_size", _WORLD.format("trainer.nnodes")),
    Alias(V, "trainer.nnodes", "combined", "trainer.world_size", _WORLD.format("trainer.n_gpus_per_node")),
    # ---- rLLM -------------------------------------------------------------------------------------------------------
    _rename(L, "rllm.stepwise_advantage", "algorithm.stepwise_advantage", subtree=True),
    _rename(L, "rllm.rejection_sample.enable", "algorithm.rejection_sample.enable"),
    _rename(L, "rllm.compact_filtering", "algorithm.compact_filtering", subtree=True),
    _rename(L, "agent.max_steps", "agent.max_turns"),
    _rename(L, "rllm.agent.max_steps", "agent.max_turns"),
    _rename(
        L,
        "rllm.mask_truncated_samples",
        "algorithm.compact_filtering.enable",
        "true: answers cut at data.max_response_length get weight 0 (compact filtering of that reason alone)",
        convert=_mask_truncated,
    ),
    _refused(L, "agent.name", "agent.agent takes the agent class's import path: agent.agent=package.module:Class"),
    _refused(L, "env.name", "agent.env takes the environment class's import path: agent.env=package.module:Class"),
    _refused(L, "rllm.agent.name", "agent.agent takes the agent class's import path: agent.agent=package.module:Class"),
    _refused(L, "rllm.env.name", "agent.env takes the environment class's import path: agent.env=package.module:Class"),
    _rename(
        L,
        "rllm.rejection_sample.multiplier",
        "algorithm.rejection_sample.max_extra_rounds",
        "rLLM draws multiplier x the batch at once; here at most multiplier - 1 more rounds, drawn as groups drop",
        convert=_multiplier,
    ),
    _rename(L, "rllm.agent.trajectory_timeout", "agent.timeout_s", "null: agent.timeout_s (60 s)", convert=_timeout),
    _rename(
        L,
        "rllm.agent.overlong_filter",
        "algorithm.compact_filtering.enable",
        "true: episodes cut at the length get weight 0",
        convert=_mask_truncated,
    ),
    _noop(L, "rllm.agent.agent_args", "empty", _EMPTY, _PY_ARGS),
    _noop(L, "rllm.agent.engine_args", "empty", _EMPTY, _PY_ARGS),
    _noop(L, "rllm.env.env_args", "empty", _EMPTY, _PY_ARGS),
    _noop(
        L,
        "rllm.workflow.use_workflow",
        "false: the agent loop runs episodes, as here",
        _FALSE,
        "rLLM's workflows are its classes; an episode here is an environment and an agent class: agent.env, "
        "agent.agent",
    ),
    _noop(L, "rllm.workflow", "used only with rllm.workflow.use_workflow=true (refused)", subtree=True),
    _noop(L, "rllm.disable_thinking", "false is the default", _FALSE, "the chat template decides: data.chat_template"),
    _noop(
        L,
        "rllm.accumulate_reasoning",
        "false is the default",
        _FALSE,
        "an agent's earlier turns are kept as the chat template renders them (data.chat_template)",
    ),
    _noop(
        L,
        "rllm.filter_token_mismatch",
        "the engine's and the trainer's logprobs are compared every step (rollout/logprob_diff)",
    ),
    _noop(L, "rllm.compact_filtering.mask_unknown", "false is the default", _FALSE, _UNKNOWN_REASON),
    _noop(
        L,
        "rllm.distill.enable",
        "false is the default",
        _FALSE,
        "distillation from a teacher is not built yet (a later issue); train with reward.function",
    ),
    _noop(L, "rllm.distill", "used only with rllm.distill.enable=true (refused)", subtree=True),
    _noop(L, "rllm.sdk", "rLLM's trace store and proxy: episodes run in-process here", subtree=True),
    _noop(
        L,
        "trainer.log_episodes",
        "false is the default",
        _FALSE,
        "validation samples are written with trainer.log_val_generations=N (val_generations/)",
    ),
    _noop(L, "trainer.episode_log_dir", "episodes are not logged to a directory (trainer.log_val_generations)"),
    # ---- ROLL: the pipeline ---------------------------------------------------------------------------------------
    _rename(R, "pretrain", "model.path"),
    _rename(R, "exp_name", "trainer.experiment_name"),
    _refused(R, "custom_envs", _ROLL_ENVS, subtree=True),
    _refused(R, "train_env_manager", _ROLL_ENVS, subtree=True),
    _refused(R, "val_env_manager", _ROLL_ENVS, subtree=True),
    _noop(R, "logging_dir", "logs go to stdout and the run directory (trainer.default_local_dir)"),
    _noop(R, "logging_steps", "metrics are logged at every step"),
    _noop(R, "tracker_kwargs", "the loggers write under the run directory (trainer.logger)", subtree=True),
    _noop(R, "system_envs", "set environment variables in the launch script; nothing here reads them", subtree=True),
    _noop(
        R,
        "checkpoint_config.type",
        "checkpoints are DCP directories on the file system",
        _is("file_system"),
        "checkpoints are written under trainer.default_local_dir (a file system; copy them elsewhere after)",
    ),
    _noop(R, "checkpoint_config.output_dir", "checkpoints go to <trainer.default_local_dir>/checkpoints (output_dir)"),
    _noop(
        R,
        "reward_pretrain",
        "the rule rewards' tokenizer (ROLL's rule workers load it); a reward model here is reward_model.model.path",
    ),
    Alias(R, "num_gpus_per_node", "combined", "trainer.world_size", _WORLD.format("num_nodes")),
    Alias(R, "num_nodes", "combined", "trainer.world_size", _WORLD.format("num_gpus_per_node")),
    _rename(R, "whiten_advantages", "algorithm.whiten_advantages", "over the whole batch, every actor rank's"),
    _rename(R, "advantage_clip", "algorithm.advantage_clip"),
    _rename(R, "value_clip", "critic.cliprange_value", "null: no value clipping"),
    _rename(
        R,
        "max_len_mask",
        "algorithm.compact_filtering.enable",
        "true: answers cut at the length get weight 0",
        convert=_mask_truncated,
    ),
    _noop(
        R,
        "error_max_len_clip",
        "false is the default",
        _FALSE,
        "answers cut at the length get weight 0 with algorithm.compact_filtering.enable=true (ROLL's max_len_mask)",
    ),
    _noop(
        R,
        "norm_mean_type",
        "null: the estimator's own normalisation (algorithm.adv_estimator)",
        _is(None),
        "group normalisation is algorithm.adv_estimator=grpo (mean and std over the group) or rloo",
    ),
    _noop(
        R,
        "norm_std_type",
        "null: the estimator's own normalisation (algorithm.adv_estimator)",
        _is(None),
        "group normalisation is algorithm.adv_estimator=grpo (mean and std over the group) or rloo",
    ),
    Alias(R, "difficulty_mask", "combined", "algorithm.rejection_sample.enable", "with its thresholds"),
    Alias(R, "difficulty_low_threshold", "combined", "algorithm.rejection_sample.enable", "with difficulty_mask"),
    Alias(R, "difficulty_high_threshold", "combined", "algorithm.rejection_sample.enable", "with difficulty_mask"),
    _noop(
        R,
        "difficulty_loss_weight",
        "false is the default",
        _FALSE,
        "per-difficulty loss weights are not built; how token losses average is actor.loss_agg_mode",
    ),
    _noop(
        R,
        "length_loss_weight",
        "false is the default",
        _FALSE,
        "per-length loss weights are not built; how token losses average is actor.loss_agg_mode",
    ),
    _rename(R, "rollout_batch_size", "data.train_batch_size", "prompts per step"),
    _rename(R, "num_return_sequences_in_group", "rollout.n"),
    _rename(R, "prompt_length", "data.max_prompt_length"),
    _rename(R, "response_length", "data.max_response_length"),
    _rename(
        R, "max_steps", "trainer.total_training_steps", "TRL's too; -1 (no cap) is null", convert=_no_cap, shared=(T,)
    ),
    _rename(R, "save_steps", "trainer.save_freq", "TRL's too", shared=(T,)),
    _rename(R, "eval_steps", "trainer.test_freq", "TRL's too", shared=(T,)),
    _rename(R, "output_dir", "trainer.default_local_dir", "TRL's too", shared=(T,)),
    _rename(
        R,
        "resume_from_checkpoint",
        "trainer.resume_mode",
        "TRL's too; false: start fresh (resume_mode=disable), true: the latest checkpoint (auto), a path: that one",
        convert=_resume,
        shared=(T,),
    ),
    _rename(R, "track_with", "trainer.logger", "stdout becomes console", convert=_loggers),
    _rename(R, "seed", "trainer.seed", "TRL's too", shared=(T,)),
    _rename(R, "adv_estimator", "algorithm.adv_estimator"),
    _rename(R, "gamma", "algorithm.gamma"),
    _rename(R, "lambd", "algorithm.lam"),
    _rename(R, "add_token_level_kl", "algorithm.use_kl_in_reward"),
    _rename(R, "init_kl_coef", "algorithm.kl_ctrl.kl_coef"),
    _rename(R, "kl_penalty", "algorithm.kl_penalty"),
    _rename(R, "target_kl", "algorithm.kl_ctrl.target_kl"),
    _rename(R, "kl_horizon", "algorithm.kl_ctrl.horizon"),
    _rename(R, "use_kl_loss", "actor.use_kl_loss"),
    _rename(R, "kl_loss_coef", "actor.kl_loss_coef"),
    _rename(R, "pg_clip", "actor.clip_ratio"),
    _rename(R, "pg_clip_low", "actor.clip_ratio_low"),
    _rename(R, "pg_clip_high", "actor.clip_ratio_high"),
    Alias(
        R, "dual_clip_loss", "combined", "actor.clip_ratio_c", "true: the bound ROLL uses, 1 + 2 x pg_clip; false null"
    ),
    _rename(R, "pg_variant", "actor.policy_loss", "vanilla/ppo become vanilla; gspo", convert=_pg_variant),
    _rename(R, "entropy_loss_coef", "actor.entropy_coeff"),
    _rename(R, "ppo_epochs", "actor.ppo_epochs"),
    _rename(R, "use_dynamic_batching_in_train", "actor.use_dynamic_bsz"),
    _rename(R, "max_tokens_per_microbatch_in_train", "actor.ppo_max_token_len_per_gpu"),
    _rename(R, "use_sequence_packing", "model.use_remove_padding"),
    _noop(
        R,
        "async_generation_ratio",
        "0 is on-policy, as here by default",
        _ZERO,
        "the look-ahead is counted in whole steps here: trainer.max_off_policy_steps=k (rollout on ranks of its own)",
    ),
    Alias(R, "rewards", "combined", "reward.function", "one domain of MathRuleRewardWorker", subtree=True),
    # ---- ROLL: actor_train ------------------------------------------------------------------------------------------
    _rename(
        R,
        "actor_train.model_args.dtype",
        "model.dtype",
        "actor, reference and critic; bf16 becomes bfloat16",
        convert=_dtype,
    ),
    _rename(
        R,
        "actor_train.model_args.disable_gradient_checkpointing",
        "model.enable_gradient_checkpointing",
        "inverted",
        convert=_inverted,
    ),
    _rename(R, "actor_train.model_args.lora_rank", "model.lora_rank"),
    _rename(R, "actor_train.model_args.lora_alpha", "model.lora_alpha"),
    _rename(
        R,
        "actor_train.model_args.lora_target",
        "model.target_modules",
        "a comma list becomes a list",
        convert=_lora_target,
    ),
    _rename(R, "actor_train.model_args.ulysses_size", "model.ulysses_sequence_parallel_size", _SP),
    _rename(R, "actor_train.training_args.learning_rate", "actor.lr"),
    _rename(R, "actor_train.training_args.weight_decay", "actor.weight_decay"),
    _rename(R, "actor_train.training_args.warmup_steps", "actor.lr_warmup_steps"),
    _rename(R, "actor_train.training_args.warmup_ratio", "actor.lr_warmup_steps_ratio"),
    _rename(R, "actor_train.training_args.lr_scheduler_type", "actor.lr_scheduler_type", "constant or cosine"),
    _rename(R, "actor_train.training_args.max_grad_norm", "actor.grad_clip"),
    _rename(R, "actor_train.training_args.per_device_train_batch_size", "actor.ppo_micro_batch_size_per_gpu"),
    _rename(
        R,
        "actor_train.training_args.gradient_accumulation_steps",
        "actor.gradient_accumulation_steps",
        "per rank: the optimizer step is micro-batch x steps x data-parallel ranks samples",
    ),
    _rename(R, "actor_train.data_args.file_name", "data.train_files"),
    _noop(R, "actor_train.data_args.dataset_dir", "data.train_files are read as given"),
    _noop(R, "actor_train.data_args.preprocessing_num_workers", "the prompts are templated once, as they load"),
    _noop(
        R,
        "actor_train.data_args.interleave_probs",
        "one set of files, read as one",
        _is(None, 1, 1.0, "1.0", "1"),
        "the files of data.train_files are read as one set, not sampled by ratio: mix them into one file",
    ),
    _noop(
        R,
        "actor_train.data_args.domain_interleave_probs",
        "one domain takes every prompt",
        lambda v: v in (None, 1, 1.0),
        "prompts are not sampled by domain here: one domain (its ratio 1.0), or mix the files of data.train_files "
        "into one",
        subtree=True,
    ),
    _noop(R, "actor_train.model_args.model_type", "null: a causal LM", _is(None), _MODEL_TYPE),
    _noop(R, "actor_train.model_args.attn_implementation", "attention is chosen by device (SDPA; flash on CUDA)"),
    _noop(R, "actor_train.model_args.flash_attn", "attention is chosen by device (SDPA; flash on CUDA)"),
    _rename(R, "actor_train.use_remove_padding", "model.use_remove_padding"),
    _noop(R, f"{TSC}.wrap_policy", "FSDP2 shards every decoder layer", subtree=True),
    _noop(R, f"{TSC}.use_batched_model_update", "the weight sync sends buckets (rollout.sync_bucket_mb)"),
    _rename(R, "actor_train.training_args.num_train_epochs", "trainer.total_epochs", "max_steps stops it first"),
    _rename(R, "actor_train.data_args.prompt", "data.prompt_key"),
    _rename(R, "actor_train.data_args.messages", "data.prompt_key", "a column of chat messages"),
    _rename(
        R,
        "actor_train.data_args.template",
        "data.chat_template",
        "native and qwen3 are the tokenizer's own (null); chatml, qwen2_5, llama3, base by name",
        convert=_template,
    ),
    _noop(R, "actor_infer.data_args.template", "one template for every role: actor_train.data_args.template"),
    _noop(R, "reference.data_args.template", "one template for every role: actor_train.data_args.template"),
    _noop(R, "validation.data_args.template", "one template for every role: actor_train.data_args.template"),
    _rename(R, "validation.data_args.file_name", "data.val_files"),
    _noop(R, "validation.generating_args.max_new_tokens", "validation answers are data.max_response_length long"),
    _rename(R, "validation.generating_args.temperature", "rollout.val_kwargs.temperature"),
    _rename(R, "validation.generating_args.top_p", "rollout.val_kwargs.top_p"),
    _rename(R, "validation.generating_args.top_k", "rollout.val_kwargs.top_k"),
    _rename(R, "validation.generating_args.num_return_sequences", "rollout.val_kwargs.n"),
    _noop(R, "validation.generating_args.num_beams", "sampling, no beam search", _ONE, _BEAMS),
    _rename(R, "validation.eval_steps", "trainer.test_freq"),
    _noop(R, "actor_infer.generating_args.num_beams", "sampling, no beam search", _ONE, _BEAMS),
    _noop(R, "actor_infer.infer_batch_size", "the engine batches every request itself"),
    _noop(R, "actor_infer.model_args.disable_gradient_checkpointing", "the engine does not train"),
    _noop(R, "actor_infer.model_args.model_type", "null: a causal LM", _is(None), _MODEL_TYPE),
    _noop(R, "reference.model_args.disable_gradient_checkpointing", "the reference does not train"),
    _noop(R, "reference.model_args.model_type", "null: a causal LM", _is(None), _MODEL_TYPE),
    _noop(R, "reference.model_args.dtype", "the reference loads as model.dtype (actor_train.model_args.dtype)"),
    _noop(R, "reference.model_args.attn_implementation", "attention is chosen by device (SDPA; flash on CUDA)"),
    _noop(R, "reference.model_args.ulysses_size", "one sequence-parallel size: actor_train.model_args.ulysses_size"),
    _noop(R, "reference.strategy_args.strategy_config", "the reference is sharded as the actor", subtree=True),
    _noop(
        R,
        "actor_train.strategy_args.strategy_name",
        "the actor trains with FSDP2: Megatron at tensor, pipeline and context sizes 1 (each refused above 1) and "
        "DeepSpeed ZeRO are data parallel, the same update",
        _is("fsdp2_train", "megatron_train", "deepspeed_train"),
        _MEGATRON,
    ),
    _noop(R, f"{TSC}.use_distributed_optimizer", "FSDP2 shards the optimizer state"),
    _noop(R, f"{TSC}.recompute_granularity", "activation checkpointing is model.enable_gradient_checkpointing"),
    _rename(R, f"{TSC}.fsdp_size", "actor.fsdp.fsdp_size"),
    _rename(R, f"{TSC}.expert_model_parallel_size", "actor.fsdp.expert_parallel_size", "EP over FSDP2"),
    _rename(R, "actor_train.router_replay.mode", "actor.router_replay", "R3 is true", convert=_router_replay),
    _rename(R, f"{TSC}.param_dtype", "actor.fsdp.param_dtype", convert=_dtype),
    _rename(R, f"{TSC}.reduce_dtype", "actor.fsdp.reduce_dtype", convert=_dtype),
    _rename(R, f"{TSC}.reshard_after_forward", "actor.fsdp.reshard_after_forward"),
    _rename(R, f"{TSC}.offload_policy", "actor.fsdp.offload_policy"),
    _noop(R, f"{TSC}.tensor_model_parallel_size", "1 is what FSDP2 does", _ONE, _MEGATRON),
    _noop(R, f"{TSC}.pipeline_model_parallel_size", "1 is what FSDP2 does", _ONE, _MEGATRON),
    _noop(R, f"{TSC}.context_parallel_size", "1 is what FSDP2 does", _ONE, _MEGATRON),
    _noop(R, "actor_train.infer_batch_size", _LOGPROB_MB),
    Alias(R, "actor_train.device_mapping", "combined", "placement.actor", "the actor's ranks"),
    # ---- ROLL: actor_infer ------------------------------------------------------------------------------------------
    _rename(R, "actor_infer.generating_args.max_new_tokens", "data.max_response_length"),
    _rename(R, "actor_infer.generating_args.temperature", "rollout.temperature"),
    _rename(R, "actor_infer.generating_args.top_p", "rollout.top_p"),
    _rename(R, "actor_infer.generating_args.top_k", "rollout.top_k"),
    _rename(R, "actor_infer.generating_args.num_return_sequences", "rollout.n"),
    _rename(R, "actor_infer.model_args.dtype", "rollout.dtype", convert=_dtype),
    _rename(R, "actor_infer.strategy_args.strategy_name", "rollout.engine", "vllm, hf_infer -> hf", convert=_engine),
    _rename(R, f"{RSC}.gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    _rename(R, f"{RSC}.tensor_parallel_size", "rollout.tensor_parallel_size"),
    _rename(R, f"{RSC}.max_num_seqs", "rollout.max_num_seqs"),
    _rename(R, f"{RSC}.enforce_eager", "rollout.enforce_eager"),
    _rename(R, f"{RSC}.load_format", "rollout.load_format", "dummy or auto", convert=_load_format),
    _noop(R, f"{RSC}.block_size", "vLLM's own block size is used"),
    _noop(R, RSC, "vLLM's other engine arguments are chosen here from rollout.*", subtree=True),
    _noop(R, f"{RSC}.sleep_level", "the engine's sleep level is the plan's: by device and colocation (trainer plan)"),
    _noop(R, f"{RSC}.max_model_len", "the engine's length is data.max_prompt_length + data.max_response_length"),
    _rename(R, "actor_infer.num_gpus_per_worker", "rollout.tensor_parallel_size", "ranks per engine"),
    Alias(R, "actor_infer.device_mapping", "combined", "placement.rollout", "its ranks; the actor's: colocated"),
    # ---- ROLL: reference and critic -------------------------------------------------------------------------------
    _rename(R, "reference.strategy_args.strategy_config.offload_policy", "reference.param_offload"),
    _noop(
        R, "reference.strategy_args.strategy_name", "the reference runs FSDP2; a frozen forward gives the same logprobs"
    ),
    _noop(
        R,
        "reference.strategy_args.strategy_config.tensor_model_parallel_size",
        "1 is what FSDP2 does",
        _ONE,
        "the reference runs FSDP2 only: it shards over its ranks (placement.reference)",
    ),
    _rename(R, "reference.infer_batch_size", "reference.log_prob_micro_batch_size_per_gpu"),
    Alias(R, "reference.device_mapping", "combined", "placement.reference", "its ranks; the actor's: colocated"),
    _rename(R, "critic.training_args.learning_rate", "critic.lr"),
    _rename(R, "critic.training_args.weight_decay", "critic.weight_decay"),
    _rename(R, "critic.training_args.per_device_train_batch_size", "critic.ppo_micro_batch_size_per_gpu"),
    Alias(R, "critic.device_mapping", "combined", "placement.critic", "its ranks; the actor's: colocated"),
    # ---- TRL (GRPOConfig): max_steps, seed, save_steps, eval_steps and output_dir are in ROLL's rows --------------
    _rename(T, "num_generations", "rollout.n"),
    _rename(T, "model_name_or_path", "model.path", "a local directory: nothing is downloaded"),
    _rename(T, "dataset_name", "data.train_files", "a local file or directory of the dataset (no hub download)"),
    _rename(T, "dtype", "model.dtype", "bfloat16, float16, float32", convert=_dtype),
    _noop(T, "log_completions", "samples are written at validation (trainer.log_val_generations)"),
    Alias(T, "num_processes", "combined", "trainer.world_size", "accelerate's: the world torchrun launched"),
    Alias(T, "num_machines", "combined", "trainer.world_size", "accelerate's, with num_processes"),
    Alias(T, "use_peft", "combined", "model.lora_rank", "with lora_r (TRL's 16), lora_alpha (32), lora_dropout"),
    Alias(T, "lora_r", "combined", "model.lora_rank", "with use_peft"),
    Alias(T, "lora_alpha", "combined", "model.lora_alpha", "with use_peft"),
    Alias(T, "lora_dropout", "combined", "model.lora_dropout", "with use_peft"),
    _rename(
        T, "lora_target_modules", "model.target_modules", "argparse's tokens, commas dropped", convert=_module_list
    ),
    _rename(T, "weight_sync_timeout", "trainer.wait_timeout_s", "bounds every wait between ranks, the sync's too"),
    _rename(T, "learning_rate", "actor.lr"),
    _rename(T, "weight_decay", "actor.weight_decay"),
    _rename(T, "warmup_steps", "actor.lr_warmup_steps"),
    _rename(T, "warmup_ratio", "actor.lr_warmup_steps_ratio"),
    _rename(T, "lr_scheduler_type", "actor.lr_scheduler_type", "constant or cosine"),
    _rename(T, "max_grad_norm", "actor.grad_clip"),
    _rename(T, "max_prompt_length", "data.max_prompt_length"),
    _rename(T, "max_completion_length", "data.max_response_length"),
    _rename(T, "temperature", "rollout.temperature"),
    _rename(T, "top_p", "rollout.top_p"),
    _rename(T, "top_k", "rollout.top_k", "None/0 (off) becomes -1", convert=_trl_top_k),
    _rename(T, "num_iterations", "actor.ppo_epochs"),
    _rename(T, "epsilon", "actor.clip_ratio"),
    _rename(T, "epsilon_high", "actor.clip_ratio_high"),
    _rename(
        T,
        "loss_type",
        "actor.loss_agg_mode",
        "grpo: seq-mean-token-mean, dr_grpo: seq-mean-token-sum-norm, bnpo/dapo: token-mean",
        convert=_trl_loss_type,
    ),
    _rename(
        T, "scale_rewards", "algorithm.norm_adv_by_std_in_grpo", "group/true or none/false", convert=_trl_scale_rewards
    ),
    _noop(
        T,
        "beta",
        "0 is no KL term, as here by default",
        _is(None, 0, 0.0),
        "the KL term is its own switch here: actor.use_kl_loss=true actor.kl_loss_coef=(beta) (k3: low_var_kl)",
    ),
    _rename(T, "per_device_train_batch_size", "actor.ppo_micro_batch_size_per_gpu"),
    _rename(
        T,
        "gradient_accumulation_steps",
        "actor.gradient_accumulation_steps",
        "per process: the optimizer step is micro-batch x steps x data-parallel ranks samples",
        shared=(R,),
    ),
    _rename(T, "num_train_epochs", "trainer.total_epochs"),
    _rename(T, "gradient_checkpointing", "model.enable_gradient_checkpointing"),
    _rename(T, "report_to", "trainer.logger", "none becomes console only", convert=_trl_report_to),
    _rename(T, "use_vllm", "rollout.engine", "true: vllm, false: hf (transformers generate)", convert=_trl_engine),
    _rename(T, "vllm_gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    _rename(T, "vllm_tensor_parallel_size", "rollout.tensor_parallel_size"),
    _noop(
        T,
        "vllm_mode",
        "colocate is the default placement here",
        _is("colocate"),
        "an engine on ranks of its own is placement.rollout=[ranks] (in-process, no server)",
    ),
    Alias(
        T,
        "reward_funcs",
        "combined",
        "reward.function",
        "TRL's built-in names are ours too; pkg.mod.func is pkg.mod:func (TRL's signature taken); "
        "get_soft_overlong_punishment is reward.overlong_buffer (256 of 1280); a model id or directory is the reward "
        "model (reward_model.*); one function and one model at most",
    ),
    Alias(
        T,
        "reward_weights",
        "combined",
        "reward.weights",
        "one per reward_funcs entry: reward.weights.rule / .reward_model",
    ),
    _rename(T, "max_staleness", "trainer.max_staleness", "async GRPO's bound, in policy versions"),
    # ---- OpenRLHF (openrlhf.cli.train_ppo_ray's flags; its defaults: configs/openrlhf.yaml) ----------------------
    _rename(OR, "actor.model_name_or_path", "model.path", "a local HF directory: nothing is downloaded"),
    _rename(
        OR,
        "reward.model_name_or_path",
        "reward_model.model.path",
        "a local sequence classifier; sets reward_model.enable (its score replaces the rule's: reward.weights)",
        convert=_orlhf_reward_model,
    ),
    _rename(
        OR,
        "reward.remote_url",
        "reward.function",
        "a .py file is OpenRLHF's reward function file: its reward_func(queries, prompts, labels), called with the "
        "response as the query; http(s) URLs, comma-separated, are reward servers (reward.server.url, its protocol)",
        convert=_orlhf_remote,
    ),
    _noop(
        OR,
        "reward.normalize_enable",
        "it whitens the reward model's scores by the mean and std saved in its head; GRPO-style estimators here "
        "normalise within each group, and reward.combine=normalize_then_sum standardises each source",
    ),
    _rename(OR, "reward.micro_batch_size", "reward_model.micro_batch_size_per_gpu", "OpenRLHF's micro_reward batch"),
    _rename(OR, "critic.model_name_or_path", "critic.model.path"),
    _refused(
        OR,
        "train.agent_func_path",
        "agents are classes here: agent.agent=package.module:Class and agent.env=package.module:Class",
    ),
    _rename(
        OR,
        "data.prompt_dataset",
        "data.train_files",
        "a local file or a list (.json, .jsonl, .csv, .parquet): nothing is downloaded; a comma list becomes a list",
        convert=_files,
    ),
    _rename(OR, "eval.dataset", "data.val_files", "a local file or a list", convert=_files),
    _rename(OR, "data.input_key", "data.prompt_key"),
    _rename(OR, "data.label_key", "data.answer_key", "the ground truth handed to reward.function"),
    _refused(
        OR,
        "data.input_template",
        "prompts use the tokenizer's chat template (data.apply_chat_template=true) or one named by data.chat_template",
    ),
    _noop(
        OR,
        "data.prompt_split",
        "the train split is the file data.train_files names",
        _is("train"),
        "data.train_files names the file of the split to train on",
    ),
    _noop(OR, "data.dataloader_num_workers", "the prompts are read into memory once when the data loads"),
    _rename(OR, "data.max_images_per_prompt", "rollout.limit_images"),
    Alias(
        OR,
        "data.max_len",
        "combined",
        "data.max_response_length",
        "prompt + response; with rollout.max_new_tokens the response's share, else half each (OpenRLHF lets a "
        "response fill what its prompt leaves; here they are two budgets, data.max_prompt_length sets the split)",
    ),
    Alias(
        OR,
        "rollout.max_new_tokens",
        "combined",
        "data.max_response_length",
        "with data.max_len the prompt's budget is what the response leaves",
    ),
    Alias(
        OR,
        "data.max_samples",
        "combined",
        "trainer.total_training_steps",
        "the first N rows: here the steps they fill, N / data.train_batch_size x train.num_episodes (the whole file "
        "is read)",
    ),
    Alias(
        OR,
        "train.num_episodes",
        "combined",
        "trainer.total_epochs",
        "passes over the prompts (OpenRLHF's default 1); no step cap unless data.max_samples gives one",
    ),
    _rename(OR, "rollout.batch_size", "data.train_batch_size", "prompts per step, as here"),
    _rename(OR, "rollout.n_samples_per_prompt", "rollout.n"),
    Alias(
        OR,
        "train.batch_size",
        "combined",
        "actor.ppo_mini_batch_size",
        "samples per optimizer step (all GPUs); here prompts: train.batch_size / rollout.n_samples_per_prompt",
    ),
    _rename(OR, "train.micro_batch_size", "actor.ppo_micro_batch_size_per_gpu", "samples per GPU, as here"),
    _rename(
        OR,
        "rollout.micro_batch_size",
        "reference.log_prob_micro_batch_size_per_gpu",
        "the reference's forward; the actor's old-logprob forward uses actor.ppo_micro_batch_size_per_gpu",
    ),
    _noop(
        OR,
        "rollout.vllm_generate_batch_size",
        "null is one call of rollout.batch_size prompts, as here",
        _is(None),
        "generating ahead of the update is trainer.max_off_policy_steps=k (rollout on ranks of its own, placement.rollout)",
    ),
    _rename(OR, "train.max_epochs", "actor.ppo_epochs", "passes over each step's rollouts"),
    _rename(OR, "train.dynamic_batch_enable", "actor.use_dynamic_bsz"),
    _rename(OR, "train.max_tokens_per_gpu", "actor.ppo_max_token_len_per_gpu"),
    _noop(OR, "rollout.max_tokens_per_gpu", "the old-logprob forward follows actor.ppo_max_token_len_per_gpu"),
    _rename(OR, "train.seed", "trainer.seed"),
    _noop(
        OR,
        "train.async_enable",
        "false is on-policy, as here by default",
        _FALSE,
        "generation ahead of the update is trainer.max_off_policy_steps=1 (rollout on ranks of its own: placement.rollout)",
    ),
    _rename(OR, "train.partial_rollout_enable", "rollout.partial_rollout"),
    # the cluster: the actor's nodes x GPUs is the world; colocate_all puts every role on them (the default here)
    Alias(OR, "actor.num_nodes", "combined", "trainer.world_size", "times actor.num_gpus_per_node (1 x 8): the world"),
    Alias(OR, "actor.num_gpus_per_node", "combined", "trainer.world_size", "times actor.num_nodes: the world"),
    Alias(OR, "ref.num_nodes", "combined", "trainer.world_size", "colocated: must match the actor's"),
    Alias(OR, "ref.num_gpus_per_node", "combined", "trainer.world_size", "colocated: must match the actor's"),
    Alias(OR, "critic.num_nodes", "combined", "trainer.world_size", "colocated: must match the actor's"),
    Alias(OR, "critic.num_gpus_per_node", "combined", "trainer.world_size", "colocated: must match the actor's"),
    Alias(OR, "reward.num_nodes", "combined", "trainer.world_size", "colocated: must match the actor's"),
    Alias(OR, "reward.num_gpus_per_node", "combined", "trainer.world_size", "colocated: must match the actor's"),
    Alias(
        OR,
        "vllm.num_engines",
        "combined",
        "trainer.world_size",
        "times vllm.tensor_parallel_size: colocated, the actor's GPUs (one engine per rollout.tensor_parallel_size ranks)",
    ),
    _rename(OR, "vllm.tensor_parallel_size", "rollout.tensor_parallel_size"),
    _noop(
        OR,
        "train.colocate_all",
        "every role and the engines share the actor's GPUs, as here by default (placement.rollout=actor)",
        _TRUE,
        "roles on GPUs of their own are placement.rollout, placement.reference and placement.critic (rank lists)",
    ),
    _noop(
        OR,
        "train.colocate_actor_ref",
        "the reference shares the actor's GPUs, as here by default",
        _TRUE,
        "a reference on GPUs of its own is placement.reference=[ranks]",
    ),
    _noop(
        OR,
        "train.colocate_critic_reward",
        "no reward model here; the critic shares the actor's GPUs by default",
        _TRUE,
        "a critic on GPUs of its own is placement.critic=[ranks]",
    ),
    # vLLM
    _rename(OR, "vllm.gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    _rename(OR, "vllm.enforce_eager", "rollout.enforce_eager"),
    _rename(OR, "vllm.enable_sleep", "rollout.free_cache_engine", "the colocated engine sleeps during the update"),
    _noop(OR, "vllm.sync_backend", "the weights are synced in-process here (no separate engine processes)"),
    _noop(OR, "vllm.sync_with_ray", "the weights are synced in-process here (no Ray)"),
    _noop(OR, "vllm.enable_prefix_caching", "vLLM's own default is used (a throughput setting)"),
    # DeepSpeed: the actor trains with FSDP2 here
    _noop(
        OR,
        "ds.zero_stage",
        "the actor trains with FSDP2, parameters, gradients and optimizer state sharded (ZeRO-3); "
        "actor.fsdp.reshard_after_forward=false keeps the gathered parameters until backward (ZeRO-2's memory)",
    ),
    _rename(
        OR,
        "ds.param_dtype",
        "actor.fsdp.param_dtype",
        "bf16 becomes bfloat16; over float32 master weights",
        convert=_dtype,
    ),
    _rename(
        OR,
        "ds.enable_sleep",
        "actor.fsdp.param_offload",
        "hybrid engine: the actor's parameters and optimizer state leave the GPU while the engine generates",
        convert=_both_offloads,
    ),
    _rename(OR, "ds.adam_offload", "actor.fsdp.offload_policy", "the optimizer steps on CPU"),
    _rename(OR, "ds.packing_samples", "model.use_remove_padding", "sequence packing, on by default here"),
    _rename(OR, "actor.gradient_checkpointing_enable", "model.enable_gradient_checkpointing"),
    _noop(OR, "actor.gradient_checkpointing_reentrant", "activation checkpointing here is non-reentrant"),
    _noop(OR, "ds.attn_implementation", "the attention kernel is chosen here by device and packing"),
    _noop(OR, "ds.use_liger_kernel", "the logprobs are computed by this project's own kernel"),
    _noop(OR, "ds.overlap_comm", "FSDP2 overlaps its communication itself"),
    _noop(OR, "ds.deepcompile", "DeepSpeed's compiler; FSDP2 here"),
    _noop(
        OR,
        "ds.tensor_parallel_size",
        "1 is what FSDP2 does",
        _ONE,
        "the actor trains with FSDP2 only (no tensor parallelism): shard it with actor.fsdp.fsdp_size",
    ),
    _noop(
        OR,
        "ds.ring_attn_size",
        "1 is no context parallelism",
        _ONE,
        "sequence parallelism here is DeepSpeed-Ulysses: model.ulysses_sequence_parallel_size=(the size)",
    ),
    _noop(OR, "ds.ring_attn_head_stride", "only with ds.ring_attn_size > 1 (refused)"),
    _rename(
        OR, "ds.experts_implementation", "model.experts_implementation", "null is auto", convert=_or_default("auto")
    ),
    _rename(OR, "ds.lora.rank", "model.lora_rank"),
    _rename(OR, "ds.lora.alpha", "model.lora_alpha"),
    _rename(OR, "ds.lora.target_modules", "model.target_modules"),
    _rename(OR, "ds.lora.dropout", "model.lora_dropout"),
    # the optimizers
    _rename(OR, "actor.adam.lr", "actor.lr"),
    _rename(OR, "actor.adam.betas", "actor.betas"),
    _rename(OR, "actor.adam.weight_decay", "actor.weight_decay"),
    _rename(
        OR,
        "actor.lr_scheduler",
        "actor.lr_scheduler_type",
        "cosine_with_min_lr is cosine (to actor.min_lr_ratio, a key of ours too)",
        convert=_orlhf_scheduler,
    ),
    _rename(OR, "actor.lr_warmup_ratio", "actor.lr_warmup_steps_ratio"),
    _rename(OR, "actor.max_norm", "actor.grad_clip"),
    _rename(OR, "critic.adam.lr", "critic.lr"),
    _rename(OR, "critic.adam.weight_decay", "critic.weight_decay"),
    _rename(
        OR, "critic.lr_scheduler", "critic.lr_scheduler_type", "cosine_with_min_lr is cosine", convert=_orlhf_scheduler
    ),
    _rename(OR, "critic.lr_warmup_ratio", "critic.lr_warmup_steps_ratio"),
    _rename(OR, "critic.max_norm", "critic.grad_clip"),
    # the losses
    _rename(OR, "actor.eps_clip", "actor.clip_ratio"),
    _rename(
        OR,
        "actor.eps_clip_low_high",
        "actor.clip_ratio_low",
        "two numbers: actor.clip_ratio_low and actor.clip_ratio_high",
        convert=_eps_low_high,
    ),
    _rename(OR, "actor.dual_clip", "actor.clip_ratio_c", "null (OpenRLHF's default) turns dual clip off"),
    _rename(OR, "actor.entropy_coef", "actor.entropy_coeff", "null is 0", convert=_or_default(0.0)),
    _rename(OR, "actor.policy_loss_type", "actor.policy_loss", "ppo is vanilla; gspo", convert=_pg_variant),
    _rename(OR, "actor.aux_loss_coef", "actor.router_aux_loss_coef"),
    _rename(OR, "critic.value_clip", "critic.cliprange_value"),
    _noop(
        OR,
        "critic.freezing_steps",
        "-1 (or 0) updates the actor from the first step, as here",
        _is(None, -1, 0),
        "no critic warm-up here (the actor and critic update every step); to start the actor gently use actor.lr_warmup_steps",
    ),
    _rename(OR, "ref.offload", "reference.param_offload"),
    Alias(
        OR,
        "algo.kl.init_coef",
        "combined",
        "algorithm.kl_ctrl.kl_coef",
        "with algo.kl.use_loss: actor.kl_loss_coef (a loss term), else the reward penalty's (algorithm.use_kl_in_reward "
        "when > 0)",
    ),
    Alias(
        OR,
        "algo.kl.use_loss",
        "combined",
        "actor.use_kl_loss",
        "the KL term in the loss, coefficient algo.kl.init_coef (OpenRLHF's default 0.01)",
    ),
    Alias(
        OR,
        "algo.kl.estimator",
        "combined",
        "actor.kl_loss_type",
        "k1, k2, k3: the loss's estimator with algo.kl.use_loss, else the reward penalty's (algorithm.kl_penalty)",
    ),
    _rename(
        OR, "algo.kl.target", "algorithm.kl_ctrl.target_kl", "a number: the adaptive controller", convert=_kl_target
    ),
    _rename(OR, "algo.kl.horizon", "algorithm.kl_ctrl.horizon"),
    _rename(
        OR,
        "algo.advantage.estimator",
        "algorithm.adv_estimator",
        "group_norm: grpo; dr_grpo: grpo, no std; reinforce_baseline: grpo, no std, whitened; reinforce: "
        "reinforce_plus_plus; gae: whitened over the batch, as OpenRLHF does",
        convert=_orlhf_estimator,
    ),
    _noop(
        OR,
        "algo.advantage.no_std_norm",
        "false divides the batch-whitened advantages by their std, as algorithm.whiten_advantages does",
        _FALSE,
        "the batch whitening here divides by the std: algorithm.whiten_advantages=false leaves the advantages as they are",
    ),
    _rename(OR, "algo.advantage.gamma", "algorithm.gamma"),
    _rename(OR, "algo.advantage.lambd", "algorithm.lam"),
    Alias(
        OR,
        "algo.advantage.is_correction_enable",
        "combined",
        f"{RC}.rollout_is",
        "tis: token weights capped at the high threshold (OpenRLHF also raises those under the low one; here they "
        "stay); icepop: tokens outside the band dropped; false: null",
    ),
    Alias(OR, "algo.advantage.is_correction_threshold", "combined", f"{RC}.rollout_is_threshold", "low and high"),
    Alias(OR, "algo.advantage.is_correction_type", "combined", f"{RC}.rollout_rs", "tis or icepop"),
    _rename(
        OR,
        "algo.dynamic_filtering_enable",
        "algorithm.rejection_sample.enable",
        "groups whose rewards are all equal are dropped and more generated",
    ),
    _noop(
        OR,
        "algo.dynamic_filtering_range",
        "0 1 keeps the groups whose mean reward is strictly inside: with rewards 0 and 1, those not all equal, as "
        "algorithm.rejection_sample.enable drops",
        _zero_one,
        "only groups with all rewards equal are dropped here (algorithm.rejection_sample.enable=true); other bands "
        "are not built",
    ),
    # checkpoints, evaluation and logging
    _rename(OR, "ckpt.path", "trainer.default_local_dir", "the run directory: checkpoints/ under it"),
    _noop(
        OR,
        "ckpt.output_dir",
        "the trained policy is the run directory's last checkpoint (trainer.default_local_dir; trainer.save_hf=true "
        "writes it as an HF model)",
    ),
    _rename(OR, "ckpt.save_steps", "trainer.save_freq", "-1 (never) is <= 0 here"),
    _rename(OR, "ckpt.save_hf", "trainer.save_hf"),
    _rename(OR, "ckpt.max_num", "trainer.max_ckpt_to_keep"),
    _rename(OR, "ckpt.load_enable", "trainer.resume_mode", "true: the latest checkpoint (auto)", convert=_load_enable),
    _noop(OR, "ckpt.max_mem", "checkpoints are counted (trainer.max_ckpt_to_keep), not weighed"),
    _noop(OR, "ckpt.disable_ds", "a checkpoint here is FSDP2's sharded state (trainer.save_hf adds an HF copy)"),
    _rename(OR, "eval.steps", "trainer.test_freq", "-1 (never) is <= 0 here"),
    _rename(
        OR, "eval.temperature", "rollout.val_kwargs.temperature", "> 0 samples (do_sample)", convert=_eval_temperature
    ),
    _rename(OR, "eval.n_samples_per_prompt", "rollout.val_kwargs.n"),
    _rename(
        OR,
        "logger.wandb.key",
        "trainer.logger",
        "a key turns wandb on; the key itself is wandb's login (WANDB_API_KEY)",
        convert=_wandb_key,
    ),
    _rename(OR, "logger.wandb.project", "trainer.project_name"),
    _rename(OR, "logger.wandb.run_name", "trainer.experiment_name"),
    _noop(OR, "logger.wandb.org", "wandb's own entity (WANDB_ENTITY) is used"),
    _noop(OR, "logger.wandb.group", "runs are not grouped"),
    _rename(
        OR,
        "logger.tensorboard_dir",
        "trainer.logger",
        "a directory turns tensorboard on; it writes under the run directory",
        convert=_tensorboard_dir,
    ),
    _noop(OR, "logger.logging_steps", "every step is logged here (metrics.jsonl)"),
    # ---- SkyRL: asynchronous training ----------------------------------------------------------------------------
    _rename(S, "trainer.fully_async.max_staleness_steps", "trainer.max_staleness", "in policy versions, as SkyRL's"),
)

CONCEPTS: tuple[Concept, ...] = (
    Concept("verl resource pool / ROLL device_mapping", "placement.actor", "and placement.{rollout,critic,reference}"),
    Concept("FSDP meta-device init", "model.load_format", "sharded (default): each rank reads only its shards; full"),
    Concept("verl one-step off-policy", "trainer.max_off_policy_steps", "0 = on-policy"),
    Concept("vLLM --tool-call-parser", "agent.tool_parser", "hermes by default"),
)
