"""The keys of a peer that make one of ours only together (verl's custom_reward_function.path + .name, a cluster's
GPUs x nodes, ROLL's device mappings and reward workers, TRL's PEFT flags, OpenRLHF's batch, length, KL and
importance-sampling flags): the alias table marks them `combined`, and `combine` turns each group into our
overrides with one note. config/aliases.py applies every other row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Any

from torchrl_post.config.alias_table import ALIASES, Alias, Refused, render_value, trl_reward_funcs
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import DataConfig, RolloutConfig
from torchrl_post.config.shipped import default_config_dir


def parse_value(text: str) -> Any:
    """An override's value as Hydra reads it (`True` -> True, `'error'` -> 'error', `[1,2]` -> [1, 2])."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(f"k={text}").value()


@dataclass
class Used:
    """One override as rewritten: where it came from (their key and value, or None for our own key)."""

    arg: str
    key: str
    value: str
    alias: Alias | None


def combine(
    rows: dict[str, tuple[Alias, str, str]], given: dict[str, str], base: str = "config"
) -> tuple[list[Used], list[str]]:
    """Keys that together make one of ours: verl's custom_reward_function.path + .name, trainer.n_gpus_per_node
    x trainer.nnodes, ROLL's dual_clip_loss with its pg_clip (`given`: every key=value of the command line; `base`:
    the shipped config the run starts from, whose values stand in for keys the command line leaves out)."""
    used: list[Used] = []
    notes: list[str] = []
    values = {key: parse_value(text) for key, (_, text, _) in rows.items()}
    args = {key: arg for key, (_, _, arg) in rows.items()}
    if "custom_reward_function.path" in rows or "custom_reward_function.name" in rows:
        path, name = values.get("custom_reward_function.path"), values.get("custom_reward_function.name")
        if path is None:
            raise ConfigError(
                "verl's custom_reward_function.name needs custom_reward_function.path (the file or module defining "
                "it); here both are one key: reward.function=path/to/file.py:function or package.module:function"
            )
        fn = f"{path}:{name or 'compute_score'}"
        arg = args.get("custom_reward_function.path", "")
        used.append(Used(arg, "reward.function", render_value(fn), _EXACT["custom_reward_function.path"]))
        notes.append(
            "verl's custom_reward_function.path + custom_reward_function.name are one key here: "
            f"reward.function={fn}" + ("" if name else " (verl's default name compute_score)")
        )
    if "dual_clip_loss" in rows:
        on, arg = values["dual_clip_loss"], args["dual_clip_loss"]
        if not isinstance(on, bool):
            raise ConfigError(f"ROLL's {arg}: it takes true or false; the bound itself is actor.clip_ratio_c")
        clip = parse_value(given.get("pg_clip", given.get("actor.clip_ratio", "0.2")))
        bound = round(1 + 2 * float(clip), 6) if on else None
        used.append(Used(arg, "actor.clip_ratio_c", render_value(bound), _EXACT["dual_clip_loss"]))
        notes.append(
            f"ROLL's {arg} is actor.clip_ratio_c={render_value(bound)} here"
            + (f" (ROLL's bound, 1 + 2 x pg_clip={clip})" if on else "")
        )
    for gpus_key, nodes_key, who in _WORLD_KEYS:
        if gpus_key not in rows and nodes_key not in rows:
            continue
        gpus, nodes = values.get(gpus_key, 8), values.get(nodes_key, 1)
        if not (isinstance(gpus, int) and isinstance(nodes, int) and gpus >= 1 and nodes >= 1):
            raise ConfigError(
                f"{who}'s {gpus_key}={gpus} x {nodes_key}={nodes} must be whole numbers >= 1; the world "
                "is the launcher's here: torchrun --nnodes N --nproc-per-node M"
            )
        arg = args.get(gpus_key) or args[nodes_key]
        used.append(
            Used(arg, "trainer.world_size", str(gpus * nodes), rows[gpus_key if gpus_key in rows else nodes_key][0])
        )
        notes.append(
            f"{who}'s {gpus_key}={gpus} x {nodes_key}={nodes} is trainer.world_size={gpus * nodes} "
            f"here: the ranks to plan for, which must equal the world torchrun launched (torchrun --nnodes {nodes} "
            f"--nproc-per-node {gpus}); the launcher, not the config, sets it"
        )
    for extra in (
        _peft,
        _trl_rewards,
        _difficulty_band,
        _roll_rewards,
        _device_mapping,
        _orlhf_world,
        partial(_orlhf_batch, base=base),
        _orlhf_lengths,
        partial(_orlhf_run_length, base=base),
        _orlhf_kl,
        _orlhf_is,
    ):
        more_used, more_notes = extra(rows, values, args, given)
        used += more_used
        notes += more_notes
    return used, notes


_WORLD_KEYS = (
    ("trainer.n_gpus_per_node", "trainer.nnodes", "verl"),
    ("num_gpus_per_node", "num_nodes", "ROLL"),
    ("num_processes", "num_machines", "TRL"),
)
"""A peer's (GPUs per node, nodes) keys: their product is trainer.world_size, which must equal the world launched."""

_Parts = tuple[list[Used], list[str]]


def _peft(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """TRL's --use_peft with its lora_r / lora_alpha / lora_dropout (TRL's defaults 16, 32, 0.05): LoRA here."""
    keys = ("use_peft", "lora_r", "lora_alpha", "lora_dropout")
    if not any(k in rows for k in keys):
        return [], []
    if values.get("use_peft") is not True:
        if values.get("use_peft") not in (None, False):
            raise ConfigError(f"TRL's {args['use_peft']}: it takes true or false")
        return [], ["TRL's " + ", ".join(args[k] for k in keys if k in rows) + " change nothing without use_peft"]
    lora = {"model.lora_rank": values.get("lora_r", 16), "model.lora_alpha": values.get("lora_alpha", 32)}
    lora["model.lora_dropout"] = values.get("lora_dropout", 0.05)
    row = rows["use_peft"][0]
    used = [Used(args["use_peft"], k, render_value(v), row) for k, v in lora.items()]
    said = ", ".join(f"{k}={render_value(v)}" for k, v in lora.items())
    return used, [f"TRL's {', '.join(args[k] for k in keys if k in rows)} is {said} here (TRL's LoRA defaults)"]


def _trl_rewards(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """TRL's --reward_funcs (built-in names, pkg.mod.func, or a model id / directory: a sequence classifier) with
    --reward_weights (one per entry, TRL's default 1 each): the rule, the reward model and their weights here."""
    if "reward_funcs" not in rows and "reward_weights" not in rows:
        return [], []
    if "reward_funcs" not in rows:
        raise ConfigError(f"TRL's {args['reward_weights']} weighs --reward_funcs, which the command line does not give")
    funcs = values["reward_funcs"] if isinstance(values["reward_funcs"], list) else [values["reward_funcs"]]
    models = [str(f) for f in funcs if "/" in str(f) and ":" not in str(f) and not str(f).endswith(".py")]
    rules = [f for f in funcs if str(f) not in models]
    if len(models) > 1:
        raise ConfigError(
            f"TRL's {args['reward_funcs']} names {len(models)} reward models ({', '.join(models)}); one reward model "
            "scores here (reward_model.model.path): keep one, or add the other's score in a reward function"
        )
    row, arg = rows["reward_funcs"][0], args["reward_funcs"]
    try:
        out: dict[str, Any] = dict(trl_reward_funcs(rules)) if rules else {}
    except Refused as e:
        raise ConfigError(f"TRL's {arg}: {e}") from e
    if models:
        out |= {"reward_model.enable": True, "reward_model.model.path": models[0]}
    weights = values.get("reward_weights")
    if weights is not None:
        weights = weights if isinstance(weights, list) else [weights]
        if len(weights) != len(funcs):
            raise ConfigError(
                f"TRL's {args['reward_weights']} gives {len(weights)} weights for the {len(funcs)} reward_funcs; "
                "give one per function (TRL's rule)"
            )
        by_source: dict[str, float] = {}
        for f, w in zip(funcs, weights, strict=True):
            source = "reward_model" if str(f) in models else "rule"
            if str(f) == "get_soft_overlong_punishment":
                continue  # a penalty added to the score here (reward.overlong_buffer), not a source
            if source in by_source:
                raise ConfigError(
                    f"TRL's {args['reward_weights']} weighs two reward functions apart; one function is the rule "
                    "here: write one returning their weighted sum and set reward.function=package.module:function"
                )
            by_source[source] = float(w)
        out |= {f"reward.weights.{k}": w for k, w in by_source.items()}
    elif models and rules:  # TRL's default: every function weighs 1
        out |= {"reward.weights.rule": 1.0, "reward.weights.reward_model": 1.0}
    used = [Used(arg, k, render_value(v), row) for k, v in out.items()]
    return used, [
        f"TRL's {', '.join(args[k] for k in ('reward_funcs', 'reward_weights') if k in rows)} is " + _said(out)
    ]


def _difficulty_band(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """ROLL's difficulty_mask keeps groups whose mean score lies in (low, high). With n samples of 0/1 rewards a band
    with 0 < low <= 1/n and (n-1)/n <= high < 1 drops exactly the uniform groups: rejection sampling here (which
    draws a group in each one's place). Any other band is refused."""
    if "difficulty_mask" not in rows:
        if any(k in rows for k in ("difficulty_low_threshold", "difficulty_high_threshold")):
            return [], ["ROLL's difficulty thresholds change nothing without difficulty_mask=true"]
        return [], []
    arg = args["difficulty_mask"]
    if values["difficulty_mask"] is not True:
        return [], [f"ROLL's {arg}: no groups are dropped, as here by default"]
    low, high = values.get("difficulty_low_threshold", 0.1), values.get("difficulty_high_threshold", 0.95)
    n_text = given.get("num_return_sequences_in_group", given.get("rollout.n", given.get("num_generations", "8")))
    n = parse_value(n_text)
    if not (isinstance(n, int) and 0 < low <= 1 / n and (n - 1) / n <= high < 1):
        raise ConfigError(
            f"ROLL's {arg} with the band ({low}, {high}) drops groups that are not uniform at {n} samples per prompt; "
            "here rejection sampling drops exactly the uniform ones (algorithm.rejection_sample.enable=true): use "
            f"thresholds with 0 < low <= 1/{n} and {n - 1}/{n} <= high < 1, or leave difficulty_mask out"
        )
    row = rows["difficulty_mask"][0]
    return [Used(arg, "algorithm.rejection_sample.enable", "true", row)], [
        f"ROLL's {arg} with the band ({low}, {high}) at {n} samples per prompt drops the uniform groups: "
        "algorithm.rejection_sample.enable=true here (a dropped group is replaced by a fresh one)"
    ]


_ROLL_MATH = "MathRuleRewardWorker"
_MATH_REWARD = "torchrl_post.reward.builtin:math_boxed"


def _roll_rewards(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """ROLL's rewards.<domain>.*: one domain scored by MathRuleRewardWorker is the built-in math reward (the answer
    in the last \\boxed{}); its other keys (model_args, world_size, tag_included...) size ROLL's worker. Several
    domains, or another worker, is refused in one line."""
    keys = [k for k in rows if k.startswith("rewards.")]
    if not keys:
        return [], []
    domains = sorted({k.split(".")[1] for k in keys})
    workers = {d: str(values.get(f"rewards.{d}.worker_cls", "")) for d in domains}
    if len(domains) != 1 or not workers[domains[0]].endswith(_ROLL_MATH):
        shown = ", ".join(f"{d} ({w.rsplit('.', 1)[-1] or 'no worker_cls'})" for d, w in workers.items())
        raise ConfigError(
            f"ROLL's rewards: {shown}: only one domain scored by {_ROLL_MATH} maps here (the built-in math reward); "
            "for other rules write a reward function and set reward.function=package.module:function (an LLM judge "
            "or a reward model is not built yet)"
        )
    row = rows[keys[0]][0]
    arg = args.get(f"rewards.{domains[0]}.worker_cls", args[keys[0]])
    return [Used(arg, "reward.function", _MATH_REWARD, row)], [
        f"ROLL's rewards.{domains[0]} ({_ROLL_MATH}) is reward.function={_MATH_REWARD} here (the answer in the last "
        "\\boxed{} against the ground truth); its worker's keys size ROLL's worker, nothing here"
    ]


_MAPPINGS = {
    "actor_train.device_mapping": "actor",
    "actor_infer.device_mapping": "rollout",
    "reference.device_mapping": "reference",
    "critic.device_mapping": "critic",
}


def _ranks(text: Any, arg: str) -> list[int]:
    """ROLL's device_mapping: a list, or the string `list(range(a, b[, step]))` its examples write."""
    if isinstance(text, list) and all(isinstance(r, int) for r in text):
        return list(text)
    m = re.fullmatch(r"\s*list\(\s*range\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?(?:,\s*(\d+)\s*)?\)\s*\)\s*", str(text))
    if m is None:
        raise ConfigError(f"ROLL's {arg}: a list of ranks or list(range(a, b)) is expected")
    start, stop, step = m.groups()
    if stop is None:
        return list(range(int(start)))
    return list(range(int(start), int(stop), int(step or 1)))


def _device_mapping(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """ROLL's device_mapping per worker: the actor's ranks are placement.actor; a worker on ranks inside the actor's
    is colocated with it (placement.<role>=actor, on all of the actor's: a note says when ROLL used fewer), one on
    ranks apart from the actor's gets them; a partial overlap is refused."""
    given_maps = {key: _ranks(values[key], args[key]) for key in _MAPPINGS if key in rows}
    if not given_maps:
        return [], []
    actor = given_maps.get("actor_train.device_mapping")
    used: list[Used] = []
    notes: list[str] = []
    for key, ranks in given_maps.items():
        role, row, arg = _MAPPINGS[key], rows[key][0], args[key]
        if role == "actor":
            used.append(Used(arg, "placement.actor", render_value(ranks), row))
            notes.append(f"ROLL's {key} is placement.actor={render_value(ranks)} here")
            continue
        if actor is not None and set(ranks) <= set(actor):
            fewer = (
                f" (ROLL used {len(ranks)} of the actor's {len(actor)} ranks; here all of them)"
                if len(ranks) < len(actor)
                else ""
            )
            used.append(Used(arg, f"placement.{role}", "actor", row))
            notes.append(f"ROLL's {key} is placement.{role}=actor here: colocated with the actor{fewer}")
        elif actor is None or not set(ranks) & set(actor):
            used.append(Used(arg, f"placement.{role}", render_value(ranks), row))
            notes.append(f"ROLL's {key} is placement.{role}={render_value(ranks)} here")
        else:
            raise ConfigError(
                f"ROLL's {arg} overlaps the actor's ranks in part; here a role is colocated with the actor "
                f"(placement.{role}=actor) or on ranks of its own (placement.{role}=[ranks])"
            )
    return used, notes


# ---- OpenRLHF's keys that make ours together ---------------------------------------------------------------------


def _base_value(base: str, key: str, fallback: Any) -> Any:
    """`key` in the shipped config `base` (configs/<base>.yaml, else configs/config.yaml under it), else `fallback`
    (a user's config under --config-path is not read: its value is what the command line leaves out)."""
    from omegaconf import OmegaConf

    for name in dict.fromkeys((base, "config")):
        path = default_config_dir() / f"{name}.yaml"
        value = OmegaConf.select(OmegaConf.load(path), key) if path.is_file() else None
        if value is not None:
            return value
    return fallback


def _given(given: dict[str, str], keys: tuple[str, ...], default: Any) -> Any:
    """The parsed value of the first of `keys` on the command line, else `default`."""
    for key in keys:
        if key in given:
            return parse_value(given[key])
    return default


def _emit(args: dict[str, str], first: tuple[str, ...], out: dict[str, Any]) -> list[Used]:
    """Our `key=value`s made by OpenRLHF's keys (`first`: theirs, the first given names the rewritten override)."""
    key = next(k for k in first if k in args)
    return [Used(args[key], k, render_value(v), _EXACT[key]) for k, v in out.items()]


def _said(out: dict[str, Any]) -> str:
    return ", ".join(f"{k}={render_value(v)}" for k, v in out.items())


def _theirs(values: dict[str, Any], keys: tuple[str, ...]) -> str:
    return " + ".join(f"{k}={render_value(values[k])}" for k in keys if k in values)


def _whole(value: Any, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


_ORLHF_CLUSTER = (
    "actor.num_nodes",
    "actor.num_gpus_per_node",
    "ref.num_nodes",
    "ref.num_gpus_per_node",
    "critic.num_nodes",
    "critic.num_gpus_per_node",
    "reward.num_nodes",
    "reward.num_gpus_per_node",
    "vllm.num_engines",
)


def _orlhf_world(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """OpenRLHF's GPU groups: the actor's nodes x GPUs (its defaults 1 x 8) is the world; with train.colocate_all
    the reference, critic and engines share them (our default placement); a group of GPUs of its own is refused."""
    if not any(k in values for k in _ORLHF_CLUSTER):
        return [], []
    nodes, gpus = values.get("actor.num_nodes", 1), values.get("actor.num_gpus_per_node", 8)
    if not (_whole(nodes) and _whole(gpus)):
        raise ConfigError(
            f"OpenRLHF's actor.num_nodes={nodes} x actor.num_gpus_per_node={gpus} must be whole numbers >= 1; the "
            "world is the launcher's here: torchrun --nnodes N --nproc-per-node M"
        )
    world = nodes * gpus
    colocate_all = _given(given, ("train.colocate_all",), False) is True
    colocate_ref = colocate_all or _given(given, ("train.colocate_actor_ref",), False) is True
    out: dict[str, Any] = {"trainer.world_size": world}
    for role, ours, colocated in (("ref", "reference", colocate_ref), ("critic", "critic", colocate_all)):
        if f"{role}.num_nodes" not in values and f"{role}.num_gpus_per_node" not in values:
            continue
        size = (values.get(f"{role}.num_nodes", 1), values.get(f"{role}.num_gpus_per_node", 8))
        if not colocated:
            raise ConfigError(
                f"OpenRLHF's {role}.num_nodes x {role}.num_gpus_per_node without train.colocate_all are GPUs of the "
                f"{ours}'s own: here that is placement.{ours}=[ranks] in the one world torchrun launches (or add "
                "--train.colocate_all: every role on the actor's ranks, the default here)"
            )
        if size != (nodes, gpus):
            raise ConfigError(
                f"OpenRLHF's {role}.num_nodes={size[0]} x {role}.num_gpus_per_node={size[1]} differ from the actor's "
                f"{nodes} x {gpus}: colocated (train.colocate_all), every role uses the actor's ranks here; a {ours} "
                f"on ranks of its own is placement.{ours}=[ranks]"
            )
    engines = ""
    if "vllm.num_engines" in values:
        n = values["vllm.num_engines"]
        tp = _given(given, ("vllm.tensor_parallel_size", "rollout.tensor_parallel_size"), 1)
        if n is None or n == 0:
            out["rollout.engine"] = "hf"
        elif not (_whole(n) and _whole(tp)):
            raise ConfigError(
                f"OpenRLHF's vllm.num_engines={n} x vllm.tensor_parallel_size={tp} must be whole numbers >= 1"
            )
        elif not colocate_all:
            raise ConfigError(
                f"OpenRLHF's vllm.num_engines={n} x vllm.tensor_parallel_size={tp} without train.colocate_all are "
                "GPUs of the engines' own: here that is placement.rollout=[ranks] in the one world torchrun launches "
                "(or add --train.colocate_all: the hybrid engine, placement.rollout=actor, the default here)"
            )
        elif n * tp != world:
            raise ConfigError(
                f"OpenRLHF's vllm.num_engines={n} x vllm.tensor_parallel_size={tp} must equal actor.num_nodes x "
                f"actor.num_gpus_per_node = {world} with train.colocate_all (OpenRLHF asserts it too): colocated, "
                "the engines here are the world / rollout.tensor_parallel_size; placement.rollout=[ranks] gives "
                "them ranks of their own"
            )
        else:
            engines = f"; its {n} vLLM engine(s) of tensor_parallel_size {tp} on the same ranks"
    if out.get("rollout.engine") == "hf":
        engines = "; vllm.num_engines=0 (no vLLM) is rollout.engine=hf"
    reward = (
        " (no reward model here: reward.num_* place nothing)" if any(k.startswith("reward.") for k in values) else ""
    )
    note = (
        f"OpenRLHF's actor.num_nodes={nodes} x actor.num_gpus_per_node={gpus} is trainer.world_size={world} here: "
        f"the ranks to plan for, which must equal the world torchrun launched (torchrun --nnodes {nodes} "
        f"--nproc-per-node {gpus}), every role colocated on them (placement.rollout=actor){engines}{reward}"
    )
    return _emit(args, _ORLHF_CLUSTER, out), [note]


def _orlhf_batch(
    rows: dict[str, tuple[Alias, str, str]],
    values: dict[str, Any],
    args: dict[str, str],
    given: dict[str, str],
    base: str = "config",
) -> _Parts:
    """OpenRLHF's train.batch_size counts samples per optimizer step (all GPUs); actor.ppo_mini_batch_size counts
    prompts: samples / rollout.n (OpenRLHF's rollout.n_samples_per_prompt, else the base config's)."""
    if "train.batch_size" not in values:
        return [], []
    samples = values["train.batch_size"]
    n = _given(given, ("rollout.n_samples_per_prompt", "rollout.n"), None)
    whose = "given"
    if n is None:
        n = _base_value(base, "rollout.n", RolloutConfig().n)
        whose = "OpenRLHF's default" if base == "openrlhf" else f"configs/{base}.yaml's: OpenRLHF's default is 1"
    if not (_whole(samples) and _whole(n)):
        raise ConfigError(f"OpenRLHF's train.batch_size={samples} and rollout.n={n} must be whole numbers >= 1")
    if samples % n:
        raise ConfigError(
            f"OpenRLHF's train.batch_size={samples} samples per optimizer step is not whole groups of rollout.n={n}: "
            f"here actor.ppo_mini_batch_size counts prompts (train.batch_size / n); give a multiple of {n}"
        )
    out = {"actor.ppo_mini_batch_size": samples // n}
    note = (
        f"OpenRLHF's train.batch_size={samples} (samples per optimizer step) is {_said(out)} here: prompts, "
        f"{samples} / rollout.n={n} ({whose})"
    )
    return _emit(args, ("train.batch_size",), out), [note]


def _orlhf_lengths(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """OpenRLHF's data.max_len is prompt + response (a response fills what its prompt leaves, or
    rollout.max_new_tokens); here two budgets: data.max_prompt_length and data.max_response_length."""
    keys = ("data.max_len", "rollout.max_new_tokens")
    if not any(k in values for k in keys):
        return [], []
    total, new = values.get("data.max_len"), values.get("rollout.max_new_tokens")
    for v in (total, new):
        if v is not None and not _whole(v):
            raise ConfigError(f"OpenRLHF's {_theirs(values, keys)}: lengths are whole numbers >= 1")
    out: dict[str, Any] = {}
    how = ""
    if new is not None:
        out["data.max_response_length"] = new
        if total is not None:
            out["data.max_prompt_length"] = total - new
            how = "the prompt's budget is what the response leaves"
    elif total is not None:
        prompt = _given(given, ("data.max_prompt_length",), None)
        response = _given(given, ("data.max_response_length",), None)
        if _whole(prompt):
            out["data.max_response_length"] = total - prompt
            how = "the response's budget is what data.max_prompt_length leaves"
        elif _whole(response):
            out["data.max_prompt_length"] = total - response
            how = "the prompt's budget is what data.max_response_length leaves"
        else:
            out = {"data.max_prompt_length": total // 2, "data.max_response_length": total - total // 2}
            how = (
                "half each: OpenRLHF lets a response fill what its prompt leaves, here they are two budgets "
                "(data.max_prompt_length or rollout.max_new_tokens moves the split)"
            )
    if any(not _whole(v) for v in out.values()):
        raise ConfigError(
            f"OpenRLHF's {_theirs(values, keys)} leave no room for a prompt or a response: the total must exceed "
            "rollout.max_new_tokens (here data.max_prompt_length + data.max_response_length)"
        )
    if not out:
        return [], [f"OpenRLHF's {_theirs(values, keys)} changes nothing here: data.max_response_length decides"]
    note = f"OpenRLHF's {_theirs(values, keys)} is {_said(out)} here" + (f" ({how})" if how else "")
    note += "; a longer prompt is dropped (data.filter_overlong_prompts), OpenRLHF cuts its start"
    return _emit(args, keys, out), [note]


def _orlhf_run_length(
    rows: dict[str, tuple[Alias, str, str]],
    values: dict[str, Any],
    args: dict[str, str],
    given: dict[str, str],
    base: str = "config",
) -> _Parts:
    """OpenRLHF trains train.num_episodes passes over the first data.max_samples prompts: here trainer.total_epochs
    and, with data.max_samples, trainer.total_training_steps (the steps those rows fill)."""
    keys = ("data.max_samples", "train.num_episodes")
    if not any(k in values for k in keys):
        return [], []
    episodes = values.get("train.num_episodes", 1)
    first = values.get("data.max_samples")
    if not _whole(episodes) or (first is not None and not _whole(first)):
        raise ConfigError(f"OpenRLHF's {_theirs(values, keys)} must be whole numbers >= 1")
    out: dict[str, Any] = {"trainer.total_epochs": episodes, "trainer.total_training_steps": None}
    how = f"{episodes} pass(es) over the prompts, no step cap"
    if first is not None:
        default = _base_value(base, "data.train_batch_size", DataConfig().train_batch_size)
        batch = _given(given, ("rollout.batch_size", "data.train_batch_size"), default)
        if not _whole(batch):
            raise ConfigError(f"OpenRLHF's data.max_samples={first}: the prompts per step must be whole, not {batch}")
        out["trainer.total_training_steps"] = max(1, first // batch) * episodes
        how = (
            f"the steps its first {first} rows fill at {batch} prompts per step, x {episodes} episode(s); the whole "
            "file is read, so a file of more rows trains on others than OpenRLHF's first ones"
        )
    note = f"OpenRLHF's {_theirs(values, keys)} is {_said(out)} here ({how})"
    return _emit(args, keys, out), [note]


def _orlhf_kl(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """OpenRLHF's KL: algo.kl.init_coef (its default 0.01) is the loss term's coefficient with algo.kl.use_loss,
    else the reward penalty's; algo.kl.estimator (k1 default) the estimator of whichever it is."""
    keys = ("algo.kl.init_coef", "algo.kl.use_loss", "algo.kl.estimator")
    if not any(k in values for k in keys):
        return [], []
    coef, loss = values.get("algo.kl.init_coef", 0.01), values.get("algo.kl.use_loss", False)
    estimator = values.get("algo.kl.estimator", "k1")
    if not isinstance(loss, bool) or estimator not in ("k1", "k2", "k3") or not isinstance(coef, (int, float)):
        raise ConfigError(
            f"OpenRLHF's {_theirs(values, keys)}: init_coef is a number, use_loss true or false, estimator k1, k2 or "
            "k3 (here actor.kl_loss_type or algorithm.kl_penalty)"
        )
    out: dict[str, Any]
    if loss:
        out = {
            "actor.use_kl_loss": True,
            "actor.kl_loss_coef": coef,
            "actor.kl_loss_type": estimator,
            "algorithm.use_kl_in_reward": False,
        }
    elif coef > 0:
        out = {"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.kl_coef": coef, "algorithm.kl_penalty": estimator}
    else:
        out = {"algorithm.use_kl_in_reward": False, "actor.use_kl_loss": False}
    defaults = " (OpenRLHF's default init_coef 0.01)" if "algo.kl.init_coef" not in values else ""
    note = f"OpenRLHF's {_theirs(values, keys)} is {_said(out)} here{defaults}"
    return _emit(args, keys, out), [note]


def _orlhf_is(
    rows: dict[str, tuple[Alias, str, str]], values: dict[str, Any], args: dict[str, str], given: dict[str, str]
) -> _Parts:
    """OpenRLHF's vLLM importance-sampling correction: tis (token weights clamped to [low, high]) is
    rollout_is=token capped at high; icepop (tokens outside [low, high] dropped) adds rollout_rs=token."""
    keys = (
        "algo.advantage.is_correction_enable",
        "algo.advantage.is_correction_threshold",
        "algo.advantage.is_correction_type",
    )
    if not any(k in values for k in keys):
        return [], []
    on = values.get(keys[0], False)
    band = values.get(keys[1], [0.5, 5.0])
    kind = values.get(keys[2], "tis")
    rc = "algorithm.rollout_correction"
    if not isinstance(on, bool) or not (
        isinstance(band, list) and len(band) == 2 and all(isinstance(x, (int, float)) for x in band)
    ):
        raise ConfigError(
            f"OpenRLHF's {_theirs(values, keys)}: is_correction_enable takes true or false and "
            f"is_correction_threshold two numbers (here {rc}.rollout_is_threshold and rollout_rs_threshold_lower)"
        )
    low, high = band
    out: dict[str, Any]
    how = ""
    if not on:
        out = {f"{rc}.rollout_is": None}
    elif kind == "tis":
        out = {f"{rc}.rollout_is": "token", f"{rc}.rollout_is_threshold": high}
        how = f"OpenRLHF also raises weights under {low} to it; here they stay"
    elif kind == "icepop":
        out = {
            f"{rc}.rollout_is": "token",
            f"{rc}.rollout_is_threshold": high,
            f"{rc}.rollout_rs": "token",
            f"{rc}.rollout_rs_threshold": high,
            f"{rc}.rollout_rs_threshold_lower": low,
        }
    else:
        raise ConfigError(
            f"OpenRLHF's algo.advantage.is_correction_type={kind} has no equivalent here: the nearest is "
            f"{rc}.rollout_rs=geometric (the sequence mask) with {rc}.rollout_is=token, whose weights are capped at "
            f"{rc}.rollout_is_threshold"
        )
    note = f"OpenRLHF's {_theirs(values, keys)} is {_said(out)} here" + (f" ({how})" if how else "")
    return _emit(args, keys, out), [note]


_EXACT = {r.key: r for r in ALIASES if not r.subtree}
