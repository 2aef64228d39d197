"""The command line as users of every peer type it: Hydra's `key=value` overrides (ours, verl's, rLLM's), Hydra's
and ROLL's spellings of the config file (`--config-name` / `-cn` / `--config_name`), and TRL's and OpenRLHF's
argparse flags (`--learning_rate 1e-6`, `--use_peft`, `--lora_target_modules q_proj v_proj`, `--config file.yaml`).

A flag becomes the override `key=value` (a bare flag is `key=true`, several values a list), so one alias table
rewrites every peer's keys; `flags` records that the line was written in flags, which only TRL and OpenRLHF do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torchrl_post.config.alias_table import render_value

_OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.\-@/]*=")
_PLAIN = re.compile(r"^[\w./:@+\-]+$")


@dataclass
class CommandLine:
    config_name: str | None = None
    """--config-name; None: not given (the loader picks ours or a peer's defaults from the keys used)."""
    config_path: str | None = None
    overrides: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    """The keys given as `--flag` (TRL / OpenRLHF style), in order."""
    files: list[str] = field(default_factory=list)
    """Flat YAML files of flags (TRL's `--config recipe.yaml`)."""


def _value_text(values: list[str]) -> str:
    """argparse values as override text: none is true, one is itself (quoted when Hydra's grammar needs it), more
    a list of those (`--range 0 1` is [0,1], numbers as argparse's `type=float` reads them)."""
    if not values:
        return "true"
    if len(values) > 1:
        return "[" + ",".join(_value_text([v]) for v in values) + "]"
    text = values[0]
    return text if _PLAIN.match(text) else render_value(text)


def parse_command_line(argv: list[str]) -> CommandLine:
    out = CommandLine()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        name, eq, inline = arg.partition("=")
        if name in ("--config-name", "-cn", "--config_name", "--config-path", "-cp", "--config_path"):
            if eq:
                value = inline
            elif i < len(argv):
                value, i = argv[i], i + 1
            else:
                value = ""
            if "name" in name or name == "-cn":
                out.config_name = value or None
            else:
                out.config_path = value or None
            continue
        if not arg.startswith("--") or len(arg) == 2:
            out.overrides.append(arg)
            continue
        key = name[2:]
        values = [inline] if eq else []
        while not eq and i < len(argv) and not argv[i].startswith("--") and not _OVERRIDE.match(argv[i]):
            values.append(argv[i])
            i += 1
        if key == "config":
            out.files += values
            continue
        out.flags.append(key)
        out.overrides.append(f"{key}={_value_text(values)}")
    return out
