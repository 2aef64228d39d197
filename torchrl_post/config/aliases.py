"""The keys users bring from verl, rLLM, ROLL, TRL, OpenRLHF and SkyRL: one table, applied to command-line overrides before Hydra.

Each row names their key (exact, or a subtree when `subtree` is set) and what it is here: our key (with a value
conversion where the values differ), a key that changes nothing here (accepted with the reason; a value that
would change behaviour we lack is refused), or a refusal that names what to use instead. `rewrite_overrides`
turns `their.key=value` into `our.key=value` and returns one note per alias used; the caller prints them.

    python -m torchrl_post.config.aliases            # rewrite docs/aliases.md from the table
    python -m torchrl_post.config.aliases --check    # exit 1 when docs/aliases.md is out of date

A YAML file in a peer's keys is read as overrides too (config/load.py), and a value conversion sees the override's
parsed value (Hydra's grammar), not interpolations. The keys that make one of ours only together are in
config/alias_combined.py.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path

from torchrl_post.config.alias_combined import Used, combine, parse_value
from torchrl_post.config.alias_table import ALIASES, CONCEPTS, SOURCES, Alias, Refused, render_value
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import Config

OUT = Path(__file__).resolve().parents[2] / "docs" / "aliases.md"

__all__ = [
    "ALIASES",
    "BASES",
    "Alias",
    "closest_keys",
    "find_alias",
    "our_keys",
    "render",
    "rewrite_overrides",
    "unknown_key",
    "written_in",
]


def our_keys(cls: type = Config, prefix: str = "") -> set[str]:
    """Every dotted key of the schema, sections included (`actor.fsdp` and `actor.fsdp.param_offload`)."""
    keys: set[str] = set()
    for f in fields(cls):  # type: ignore[arg-type]
        key = f"{prefix}{f.name}"
        keys.add(key)
        default = f.default if f.default_factory is MISSING else f.default_factory()
        if is_dataclass(default):
            keys |= our_keys(type(default), f"{key}.")
    return keys


def find_alias(key: str) -> Alias | None:
    """The row for `key`: its exact row, else the longest subtree row above it."""
    exact = _EXACT.get(key)
    if exact is not None:
        return exact
    best: Alias | None = None
    for row in _SUBTREES:
        if key.startswith(row.key + ".") and (best is None or len(row.key) > len(best.key)):
            best = row
    return best


def closest_keys(key: str, n: int = 2) -> list[str]:
    """The real keys nearest to a misspelt `key`, by its whole dotted name: the schema's and the alias table's
    (a verl key with a typo is closest to the verl key; naming only the first unknown part, as OmegaConf does, says
    nothing about `actor_rollout_ref.actor.ppo_mini_batch_sizee`). Sections are offered only for a section-like key."""
    return _closest(key, _SUGGESTABLE, n)


def _closest(key: str, keys: list[str], n: int) -> list[str]:
    """difflib's closest of `keys` to `key`, whole dotted names, whose last parts are alike too (a long shared prefix
    alone makes `rllm.stepwise_advantage.no_such_key` look like `rllm.stepwise_advantage.mode`)."""
    last = key.rsplit(".", 1)[-1]
    near = difflib.get_close_matches(key, keys, n=n + 4, cutoff=0.75)
    alike = [k for k in near if difflib.SequenceMatcher(None, last, k.rsplit(".", 1)[-1]).ratio() >= 0.6]
    return alike[:n]


def unknown_key(key: str, arg: str) -> str:
    """One line for an unknown `key` (from override or YAML entry `arg`): the whole key, the closest real ones."""
    near = closest_keys(key)
    fix = f"did you mean {' or '.join(near)}?" if near else "no key is close to it;"
    return f"{arg}: unknown config key '{key}'; {fix} every key is in docs/config.md (verl / ROLL / TRL keys: docs/aliases.md)"


DEFAULTS_FROM = {
    "torchrl_post": "this project's (configs/config.yaml)",
    "verl": "verl's ppo_trainer.yaml (configs/verl.yaml)",
    "roll": "ROLL's RLVR pipeline (configs/roll.yaml)",
    "trl": "TRL's GRPOConfig (configs/trl.yaml)",
    "openrlhf": "OpenRLHF's train_ppo_ray (configs/openrlhf.yaml)",
}
"""trainer.defaults_from -> where its defaults come from (the plan's first line)."""


BASES = {"verl": "verl", "rLLM": "verl", "ROLL": "roll", "TRL": "trl", "OpenRLHF": "openrlhf"}
"""A source -> the shipped config with its defaults (rLLM trains on verl's ppo_trainer.yaml)."""
FLAG_SOURCES = ("TRL", "OpenRLHF")
"""The sources whose command lines are argparse flags (`--learning_rate 1e-6`, `--actor.adam.lr 5e-7`)."""


def written_in(overrides: list[str], flags: bool = False) -> tuple[str | None, list[str]]:
    """(the config with the defaults of the one peer whose keys the command line uses, or None; the keys that say
    so). A key that is ours, or the same name in several peers, says nothing alone; keys of two peers say nothing
    (the caller's defaults stay). Flags (`--key value`) are TRL's and OpenRLHF's way of writing a command line."""
    peers = {BASES.get(s, s) for s in FLAG_SOURCES} if flags else None
    keys: list[str] = []
    for arg in overrides:
        head, eq, _ = arg.partition("=")
        key = head.lstrip("+~")
        row = find_alias(key) if eq and key not in _KEYS else None
        if row is None or row.kind == "same":
            continue
        sources = {BASES.get(s, s) for s in (row.source, *row.shared)}
        peers = sources if peers is None else peers & sources
        keys.append(key)
    if peers is None or len(peers) != 1:
        return None, keys
    (peer,) = peers
    return (peer if peer in BASES.values() else None), keys


def _who(row: Alias, key: str, base: str = "config") -> str:
    """Whose key it is, said as the run's base peer when the key is that peer's too (TRL's max_steps, not ROLL's)."""
    source = next((s for s in row.shared if BASES.get(s) == base), row.source)
    return f"{source}'s {key}"


def _apply_row(row: Alias, key: str, text: str, prefix: str, base: str = "config") -> tuple[list[Used], str]:
    """The overrides and the note for one aliased `key=text`; a refusal raises one ConfigError line."""
    who = f"{_who(row, key, base)}={text}"
    if row.kind == "refused":
        raise ConfigError(f"{who} has no equivalent here: {row.refuse}")
    value = parse_value(text)
    if row.kind == "noop":
        if row.accepts is not None and not row.accepts(value):
            raise ConfigError(f"{who} has no equivalent here: {row.refuse}")
        return [], f"{who} accepted, it changes nothing here: {row.noop}"
    ours = row.ours + key[len(row.key) :] if row.subtree else row.ours
    if row.subtree and ours not in _KEYS:
        under = [k for k in _KEYS if k.startswith(row.ours + ".")]
        near = _closest(ours, under, 2)
        hint = f"did you mean {' or '.join(row.key + k[len(row.ours) :] for k in near)}? " if near else ""
        raise ConfigError(
            f"{who}: it would be {ours} here, which does not exist; {hint}the keys under {row.ours} are in "
            "docs/config.md"
        )
    if row.convert is not None:
        try:
            converted = row.convert(value)
        except Refused as e:
            raise ConfigError(f"{who} has no equivalent here: {e}") from None
        if isinstance(converted, dict):  # one of theirs is several of ours (or, for this value, none)
            if not converted:
                return [], f"{who} accepted, it changes nothing here" + (f" ({row.note})" if row.note else "")
            used = [Used(f"{prefix}{key}={text}", k, render_value(v), row) for k, v in converted.items()]
            said = ", ".join(f"{u.key}={u.value}" for u in used)
            return used, f"{who} is {said} here" + (f" ({row.note})" if row.note else "")
        new_text = render_value(converted)
    else:
        new_text = text
    used = [Used(f"{prefix}{key}={text}", ours, new_text, row)]
    used += [Used(f"{prefix}{key}={text}", k, v, row) for k, v in row.also]
    said = ", ".join(f"{u.key}={u.value}" for u in used)
    return used, f"{who} is {said} here" + (f" ({row.note})" if row.note and row.convert else "")


_LISTS = {"trainer.logger"}
"""List keys a peer also takes as one name (verl's trainer.logger=console): the name becomes a list of one."""


def rewrite_overrides(overrides: list[str], base: str = "config") -> tuple[list[str], list[str]]:
    """(the overrides with every alias replaced by our keys, one note per alias used). Keys that are ours pass
    through untouched; an unknown key that is no alias too (Hydra names it). A refused alias, or two keys that
    set one of ours to different values, raises one ConfigError line. `base`: the shipped config the run starts
    from (--config-name), whose values a rewrite reads for keys the command line leaves out (OpenRLHF's
    train.batch_size divided by its rollout.n)."""
    used: list[Used] = []
    notes: list[str] = []
    combined: dict[str, tuple[Alias, str, str]] = {}
    for arg in overrides:
        head, eq, text = arg.partition("=")
        key = head.lstrip("+~")
        prefix = head[: len(head) - len(key)]
        row = find_alias(key) if eq and key not in _KEYS else None
        if key in _LISTS and eq and isinstance(parse_value(text), str):  # verl takes a logger's name alone
            used.append(Used(f"{key}=[{text}]", key, f"[{text}]", None))
            continue
        if row is None or row.kind == "same":
            used.append(Used(arg, key, text, None))
            continue
        if row.kind == "combined":
            combined[key] = (row, text, arg)
            continue
        out, note = _apply_row(row, key, text, prefix.replace("+", ""), base)
        used += out
        notes.append(note)
    if combined:
        given = {a.partition("=")[0].lstrip("+~"): a.partition("=")[2] for a in overrides}
        out, more = combine(combined, given, base)
        used += out
        notes += more
    _check_conflicts(used)
    rewritten = [u.arg if u.alias is None else f"{u.key}={u.value}" for u in used]
    return rewritten, notes


def _check_conflicts(used: list[Used]) -> None:
    """An alias and another key (ours or an alias) that set one key to different values: one line naming both."""
    seen: dict[str, Used] = {}
    for u in used:
        first = seen.setdefault(u.key, u)
        if first is u or (first.alias is None and u.alias is None):
            continue
        if first.value != u.value:
            raise ConfigError(
                f"{first.arg} and {u.arg} both set {u.key} ({first.value} and {u.value}); keep one of them"
            )


# ---- the generated reference: docs/aliases.md ------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _what(row: Alias) -> str:
    if row.kind == "refused":
        return f"refused: {row.refuse}"
    if row.kind == "noop":
        what = f"accepted, changes nothing: {row.noop}"
        return what + (f"; other values refused: {row.refuse}" if row.refuse else "")
    if row.kind == "combined":
        return f"`{row.ours}`"
    star = ".*" if row.subtree else ""
    return f"`{row.ours}{star}`" + (" (same name)" if row.kind == "same" else "")


def render() -> str:
    lines = [
        "# Keys from verl, rLLM, ROLL, TRL, OpenRLHF and SkyRL",
        "",
        "Generated from `torchrl_post/config/alias_table.py` by `python -m torchrl_post.config.aliases`; a test keeps",
        "it current. Their keys work on our command line: each is rewritten to ours before the config is composed, and",
        "the run prints one `note:` line per key it rewrote. A key with no equivalent stops the run with one line",
        "naming what to use instead. `.*` maps a whole subtree. Rows marked *same name* need no rewriting. A YAML",
        "file under `--config-path` must use our keys: one of theirs there stops the run with one line naming the",
        "file and what to write instead.",
        "",
    ]
    for source in SOURCES:
        rows = [r for r in ALIASES if r.source == source]
        lines += [f"## {source} ({len(rows)} keys)", "", "| their key | here | note |", "|---|---|---|"]
        for r in rows:
            star = ".*" if r.subtree else ""
            lines.append(f"| `{r.key}{star}` | {_cell(_what(r))} | {_cell(r.note)} |")
        lines.append("")
    lines += ["## Concepts without a key", "", "| theirs | here | note |", "|---|---|---|"]
    lines += [f"| {_cell(c.theirs)} | `{c.ours}` | {_cell(c.note)} |" for c in CONCEPTS]
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/aliases.md is out of date")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    text = render()
    if args.check:
        if (args.out.read_text() if args.out.exists() else "") != text:
            print(f"error: {args.out} is out of date; run python -m torchrl_post.config.aliases", file=sys.stderr)
            sys.exit(1)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")


_KEYS = our_keys()
_EXACT = {r.key: r for r in ALIASES if not r.subtree}
_SUBTREES = [r for r in ALIASES if r.subtree]
_SUGGESTABLE = sorted(_KEYS | set(_EXACT) | {r.key for r in _SUBTREES})

if __name__ == "__main__":
    main()
