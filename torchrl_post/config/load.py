"""Compose the config (schema + the shipped YAML in configs/ + key=value overrides) and validate it, with one-line
errors.

We call Hydra's compose API rather than `@hydra.main` so that an unknown key or a wrong type becomes one
line naming the key (not a multi-line Hydra report), and so Hydra neither changes directory nor writes
its own output folders: the run directory is ours (trainer.default_local_dir).
"""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchrl_post.algos.estimators import NEEDS_VALUES
from torchrl_post.config.alias_table import render_value
from torchrl_post.config.aliases import BASES, DEFAULTS_FROM, find_alias, rewrite_overrides, unknown_key, written_in
from torchrl_post.config.command_line import parse_command_line
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import Config
from torchrl_post.config.shipped import default_config_dir
from torchrl_post.config.validate import validate

SCHEMA_NAME = "torchrl_post_schema"


def _one_line(exc: BaseException) -> str:
    """The most specific message in an exception chain, on one line, naming the full key if known."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in reversed(chain):
        if isinstance(e, OmegaConfBaseException) and getattr(e, "full_key", None):
            msg = str(getattr(e, "msg", "") or str(e)).splitlines()[0]
            key = e.full_key
            if "not in" in msg and "Key" in msg:
                return f"unknown config key '{key}': {msg}; the keys are in torchrl_post/config/schema.py"
            if "is not a subclass of" in msg and is_dataclass(_schema_node(str(key))):
                return (
                    f"config key '{key}' is a section, not a value ({msg}); set its keys one by one: "
                    f"{key}.<key>=value (they are in docs/config.md)"
                )
            return f"config key '{key}': {msg}"
    return " ".join(str(exc).split())


def _in_schema(dotted: str) -> bool:
    """Whether `dotted` names a key of the schema. A key below a field that is not a section (a field typed Any,
    such as placement.actor) counts as known: what it takes is that field's to say (Hydra's message)."""
    node: Any = Config
    for part in dotted.split("."):
        if not is_dataclass(node):
            return True
        found = {f.name: f for f in fields(node)}
        if part not in found:
            return False
        f = found[part]
        node = f.default if f.default_factory is MISSING else f.default_factory()
    return True


def check_keys(overrides: list[str]) -> None:
    """Every override's key is ours (after the alias rewriting) or Hydra's own (hydra.*); else one line naming the
    whole key and the closest real keys. OmegaConf would name only the first part it does not know
    (`actor_rollout_ref` for `actor_rollout_ref.actor.ppo_mini_batch_sizee`), and suggest nothing."""
    for arg in overrides:
        key = arg.split("=", 1)[0].lstrip("+~")
        if key and key != "hydra" and not key.startswith("hydra.") and not _in_schema(key):
            raise ConfigError(unknown_key(key, arg))


def _schema_node(dotted: str) -> Any:
    """The schema's default at `dotted` (a section's dataclass, or a value); None past a field that is not one."""
    node: Any = Config
    for part in dotted.split("."):
        if not is_dataclass(node):
            return None
        f = {f.name: f for f in fields(node)}[part]
        node = f.default if f.default_factory is MISSING else f.default_factory()
    return node


def _written_in_ours(path: Path) -> bool:
    """Whether a user's YAML file uses our keys only, at every depth (then Hydra composes it as it is); one with a
    peer's keys, or an unknown one, is read through the alias table instead (`peer_yaml_overrides`)."""
    try:
        data = OmegaConf.to_container(OmegaConf.load(path))
    except Exception:  # malformed YAML: Hydra's own message names the file
        return True
    if not isinstance(data, dict):
        return True

    def ours(node: dict[Any, Any], prefix: str) -> bool:
        for k, value in node.items():
            key = f"{prefix}{k}"
            if key in ("defaults", "hydra") or key.startswith("hydra."):
                continue
            if not _in_schema(key):
                return False
            if isinstance(value, dict) and is_dataclass(_schema_node(key)) and not ours(value, key + "."):
                return False
        return True

    return ours(data, "")


HYDRA_GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic"


def check_override_syntax(arg: str) -> None:
    """One override in Hydra's grammar, with a key; else one line naming the override (Hydra's own message
    often does not: `no viable alternative at input '[1,2'`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not isinstance(arg, str):
        raise ConfigError(f"override {arg!r} must be a string key=value")
    try:
        parsed = OverridesParser.create().parse_override(arg)
    except Exception as e:  # HydraException (OverrideParseException) and ANTLR's errors
        msg = " ".join(str(e).split()).split(" See https://")[0]
        raise ConfigError(
            f"override {arg!r} is not valid override syntax ({msg}); write key=value, quoting a value with "
            f"special characters as key='...' (grammar: {HYDRA_GRAMMAR})"
        ) from e
    if not parsed.key_or_group:
        raise ConfigError(f"override {arg!r} has no key; write key=value (e.g. actor.lr=1e-4)")
    if parsed.is_sweep_override():
        raise ConfigError(
            f"override {arg!r} is a sweep (a comma or sweep function outside brackets), which one run cannot take; "
            "write key=[a,b] for a list or key='a,b' for a string"
        )


def load_config(
    overrides: list[str] | None = None,
    config_name: str | None = None,
    config_path: str | None = None,
    notes: list[str] | None = None,
    flags: bool = False,
) -> Config:
    """Compose `<config_name>.yaml` over the schema with `key=value` overrides; validate. The YAML is looked up
    in `config_path` (a user's directory, as Hydra's --config-path) first, then in the shipped configs
    (default_config_dir), so a user's file can start from ours (`defaults: [config, _self_]`). A user's file written
    with a peer's keys (ROLL's YAML) is read as overrides, through the same table. Overrides with verl / rLLM / ROLL /
    TRL / OpenRLHF keys are rewritten to ours first (config/aliases.py); one line per alias used is appended to
    `notes` for the caller to print. `config_name` None: configs/config.yaml, or the defaults of the one peer whose
    keys the overrides (or `flags`: given as TRL's and OpenRLHF's `--key value`) are written in (configs/verl.yaml,
    roll.yaml, trl.yaml, openrlhf.yaml)."""
    for arg in overrides or []:
        check_override_syntax(arg)
    overrides = list(overrides or [])
    user = _user_dir(config_path)
    files = _user_files(user, config_name or "config")
    if files and not all(_written_in_ours(f) for f in files):
        given = frozenset(o.split("=", 1)[0].lstrip("+~") for o in overrides)
        base, from_files = _peer_yaml(files[-1], given)
        overrides = [*from_files, *overrides]
        config_name, user = base, None
    if config_name is None:
        config_name = "config"
        peer, keys = written_in(overrides, flags)
        if peer is not None:
            config_name = peer
            if notes is not None:
                shown = ", ".join(dict.fromkeys(keys[:3])) or "flags"
                who = next(source for source, base in BASES.items() if base == peer)
                notes.append(
                    f"defaults: {DEFAULTS_FROM[peer]}, as the keys given are {who}'s ({shown}); --config-name "
                    "config starts from this project's"
                )
    overrides, alias_notes = rewrite_overrides(overrides, base=config_name)
    if notes is not None:
        notes.extend(alias_notes)
    # Unknown keys (Hydra's `+key=value` appends them; the schema is closed) are refused here, with suggestions.
    check_keys(overrides)
    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)
    GlobalHydra.instance().clear()
    shipped = default_config_dir()
    if not any((d / f"{config_name}.yaml").is_file() for d in (shipped, *([user] if user else []))):
        names = ", ".join(sorted(f.stem for f in shipped.glob("*.yaml")))
        where = f"{user} nor " if user else ""
        raise ConfigError(
            f"--config-name {config_name}: neither {where}the shipped configs have {config_name}.yaml (shipped: "
            f"{names}); give --config-path the directory of yours"
        )
    primary, search = shipped, list(overrides)
    if user is not None:
        # The primary config comes from whichever directory has it; the other one is on the search path.
        other = shipped
        if (user / f"{config_name}.yaml").is_file():
            primary = user
        else:
            other = user
        search = [f"hydra.searchpath=[file://{other}]", *search]
    try:
        with initialize_config_dir(config_dir=str(primary), version_base="1.3"):
            dcfg = compose(config_name=config_name, overrides=search)
        cfg = OmegaConf.to_object(dcfg)
    except Exception as e:  # Hydra and OmegaConf raise many types; all are user input errors here
        raise ConfigError(_one_line(e)) from e
    assert isinstance(cfg, Config)
    validate(cfg)
    critic = [o.split("=", 1)[0].lstrip("+~") for o in overrides if o.lstrip("+~").startswith("critic.")]
    if critic and cfg.algorithm.adv_estimator not in NEEDS_VALUES and notes is not None:
        notes.append(
            f"{', '.join(critic[:3])}{' ...' if len(critic) > 3 else ''} set a critic that "
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} does not use (only gae does): they change nothing"
        )
    return cfg


def load_command_line(argv: list[str], notes: list[str] | None = None) -> Config:
    """The config of a `torchrl_post.train` command line, written as any peer writes one (config/command_line.py):
    TRL's `--config` files and flags, ROLL's --config_path / --config_name, verl's and ours key=value."""
    line = parse_command_line(argv)
    typed = {o.split("=", 1)[0].lstrip("+~") for o in line.overrides}  # a flag typed wins over the file's (TRL's)
    from_files = [o for f in line.files for o in peer_yaml_overrides(Path(f))]
    given = [o for o in from_files if o.split("=", 1)[0] not in typed] + line.overrides
    flags = bool(line.flags or line.files)
    return load_config(given, line.config_name, line.config_path, notes, flags)


def _user_dir(config_path: str | None) -> Path | None:
    if config_path is None:
        return None
    user = Path(config_path).expanduser().resolve()
    if not user.is_dir():
        raise ConfigError(f"--config-path {config_path!r} is not a directory of YAML configs")
    return user


def peer_yaml_overrides(path: Path) -> list[str]:
    """A YAML file of a peer's keys (TRL's `--config recipe.yaml`) as overrides: `_peer_yaml` without a base."""
    return _peer_yaml(path)[1]


def _peer_yaml(path: Path, overridden: frozenset[str] = frozenset()) -> tuple[str | None, list[str]]:
    """(the shipped config its `defaults` list names, if any; the `key=value` overrides of its leaves). A file in a
    peer's keys (ROLL's pipeline configs): the files its `defaults` list names (relative to it, `name@_here_`
    included) first, then its own keys; `hydra` dropped; interpolations resolved; a key the command line sets
    (`overridden`) left to it. The file's keys are checked here, so an unknown or refused key's line names the
    file."""
    base, chain = _peer_yaml_chain(path, [])
    merged: DictConfig | ListConfig = OmegaConf.create({})
    for f in chain:
        try:
            node = OmegaConf.load(f)
        except Exception as e:
            raise ConfigError(f"{f}: not readable YAML ({' '.join(str(e).split())})") from None
        if isinstance(node, DictConfig):
            node.pop("defaults", None)
            node.pop("hydra", None)
            merged = OmegaConf.merge(merged, node)
    try:
        data = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path}: an interpolation cannot be resolved ({_one_line(e)})") from None
    out: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        for k, value in node.items():
            key = f"{prefix}{k}"
            if isinstance(value, dict) and value and not _leaf_section(key):
                walk(value, key + ".")
                continue
            if key in overridden:
                continue  # the command line sets it (verl's multi-turn yaml names sglang; its script, vllm)
            out.append(f"{key}={render_value(value)}")

    if isinstance(data, dict):
        walk(data, "")
    try:  # a key refused (no equivalent here) is said before an unknown or malformed one
        rewritten = rewrite_overrides(out)[0]
        for arg in out:
            check_override_syntax(arg)
        check_keys(rewritten)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return base, out


def _leaf_section(key: str) -> bool:
    """A mapping that is one value (an alias row for exactly this key, or a schema field that is not a section)."""
    row = find_alias(key)
    if row is not None and row.key == key and not row.subtree:
        return True
    return _in_schema(key) and not is_dataclass(_schema_node(key)) and _schema_node(key) is not None


def _peer_yaml_chain(path: Path, seen: list[Path]) -> tuple[str | None, list[Path]]:
    """(a shipped config named in the `defaults` lists, the files to merge: each file after the files of its
    `defaults` list, depth first, Hydra's order with `_self_` last)."""
    if path in seen:
        return None, []
    seen.append(path)
    try:
        data = OmegaConf.to_container(OmegaConf.load(path))
    except Exception:
        return None, [path]
    base: str | None = None
    chain: list[Path] = []
    defaults = data.get("defaults") if isinstance(data, dict) else None
    for entry in defaults if isinstance(defaults, list) else []:
        if not isinstance(entry, str) or entry == "_self_" or entry == SCHEMA_NAME:
            continue
        name = entry.split("@", 1)[0]
        f = (path.parent / f"{name}.yaml").resolve()
        if not f.is_file() and name in PEER_BASES:  # verl's own base config: its defaults are configs/verl.yaml
            base = PEER_BASES[name]
            continue
        if not f.is_file() and (default_config_dir() / f"{name}.yaml").is_file():
            base = name
            continue
        if not f.is_file():
            raise ConfigError(f"{path}: defaults entry {entry!r}: {f} does not exist")
        deeper, more = _peer_yaml_chain(f, seen)
        base, chain = base or deeper, chain + more
    return base, [*chain, path]


PEER_BASES = {"ppo_trainer": "verl", "agent_ppo_trainer": "verl"}
"""A peer's shipped config a user's YAML names in its defaults list (verl's, rLLM's) -> the base with its defaults."""


def _user_files(user: Path | None, config_name: str) -> list[Path]:
    """The user's YAML files a composition reads: `<config_name>.yaml` and, transitively, the files of the same
    directory its `defaults` list names (those of the shipped configs are ours), the named file last."""
    if user is None or not (user / f"{config_name}.yaml").is_file():
        return []
    try:
        return _peer_yaml_chain(user / f"{config_name}.yaml", [])[1]
    except ConfigError:
        return [user / f"{config_name}.yaml"]


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
