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
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchrl_post.config.alias_table import render_value
from torchrl_post.config.aliases import find_alias, rewrite_overrides, unknown_key
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import validate

SCHEMA_NAME = "torchrl_post_schema"


def default_config_dir() -> Path:
    """The shipped YAML configs: `torchrl_post/configs/` inside an installed wheel (setup.py copies the repository's
    `configs/` there at build time), else `configs/` at the root of the source checkout (editable installs)."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "configs", package.parent / "configs"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise ConfigError(
        f"the default YAML configs are missing: neither {package / 'configs'} (an installed wheel) nor "
        f"{package.parent / 'configs'} (a source checkout) has config.yaml"
    )


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


def _yaml_files(user: Path, config_name: str) -> list[Path]:
    """The user's YAML files a composition reads: `<config_name>.yaml` and, transitively, the files of the same
    directory its `defaults` list names (those of the shipped configs are ours)."""
    out: list[Path] = []
    todo = [config_name]
    while todo:
        f = user / f"{todo.pop(0)}.yaml"
        if not f.is_file() or f in out:
            continue
        out.append(f)
        try:
            data = OmegaConf.to_container(OmegaConf.load(f))
        except Exception:  # Hydra reports a malformed file itself, with its path
            continue
        defaults = data.get("defaults") if isinstance(data, dict) else None
        for entry in defaults if isinstance(defaults, list) else []:
            if isinstance(entry, str) and entry != "_self_":
                todo.append(entry)
    return out


def check_user_yaml(path: Path) -> None:
    """A YAML file under --config-path uses our keys: a verl / rLLM / ROLL / TRL key there is refused with one line
    naming the file, the key and what it is here (the command line's rewriting, config/aliases.py, done for the
    entry); an unknown key with the closest real ones. Only command-line overrides are rewritten: a file keeps one
    spelling, ours, which the run's config.yaml and every doc use."""
    try:
        data = OmegaConf.to_container(OmegaConf.load(path))
    except Exception:  # malformed YAML: Hydra's own message names the file
        return
    if not isinstance(data, dict):
        return

    def walk(node: dict[Any, Any], prefix: str) -> None:
        for k, value in node.items():
            key = f"{prefix}{k}"
            if key in ("defaults", "hydra") or key.startswith("hydra."):
                continue
            if _in_schema(key):
                if isinstance(value, dict) and is_dataclass(_schema_node(key)):
                    walk(value, key + ".")
                continue
            row = find_alias(key)
            if row is None and isinstance(value, dict) and value:
                walk(value, key + ".")  # e.g. actor_rollout_ref: {actor: {...}}: its leaves may be aliases
                continue
            entry = f"{path}: {key}: {render_value(value)}"
            if row is None:
                raise ConfigError(unknown_key(key, entry))
            try:
                ours, _ = rewrite_overrides([f"{key}={render_value(value)}"])
            except ConfigError as e:
                raise ConfigError(f"{path}: {e}") from None
            said = ", ".join(o.replace("=", ": ", 1) for o in ours) or "nothing (it changes nothing here; delete it)"
            raise ConfigError(
                f"{entry}: {row.source}'s key, which only command-line overrides may use (they are rewritten, a "
                f"YAML file is not); write ours in the file: {said}"
            )

    walk(data, "")


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
    config_name: str = "config",
    config_path: str | None = None,
    notes: list[str] | None = None,
) -> Config:
    """Compose `<config_name>.yaml` over the schema with `key=value` overrides; validate. The YAML is looked up
    in `config_path` (a user's directory, as Hydra's --config-path) first, then in the shipped configs
    (default_config_dir), so a user's file can start from ours (`defaults: [config, _self_]`). Overrides with
    verl / rLLM / ROLL keys are rewritten to ours first (config/aliases.py); one line per alias used is appended
    to `notes` for the caller to print."""
    for arg in overrides or []:
        check_override_syntax(arg)
    overrides, alias_notes = rewrite_overrides(list(overrides or []))
    if notes is not None:
        notes.extend(alias_notes)
    # Unknown keys (Hydra's `+key=value` appends them; the schema is closed) are refused here, with suggestions.
    check_keys(overrides)
    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)
    GlobalHydra.instance().clear()
    shipped = default_config_dir()
    primary, search = shipped, list(overrides or [])
    if config_path is not None:
        user = Path(config_path).expanduser().resolve()
        if not user.is_dir():
            raise ConfigError(f"--config-path {config_path!r} is not a directory of YAML configs")
        # The primary config comes from whichever directory has it; the other one is on the search path.
        other = shipped
        if (user / f"{config_name}.yaml").is_file():
            primary = user
            for f in _yaml_files(user, config_name):
                check_user_yaml(f)
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
    return cfg


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
