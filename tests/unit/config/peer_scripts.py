"""Real launch scripts of verl, rLLM, ROLL, TRL and OpenRLHF (tests/peer_scripts/), run through our entrypoint's dry run.

    python -m tests.unit.config.peer_scripts          # the markdown table: verdict and keys understood per script

Each kept file starts with comment lines naming its source (repository, path, commit); the original follows byte
for byte. `read_launch` turns a file into what its user would pass to our entrypoint (`Launch.args`), `substitute`
replaces only paths (models, data, output directories) and cluster sizes (GPUs, nodes, device mappings) through one
table keyed by key name (`RULES`), and `dry_run` runs `torchrl_post.train`'s dry run in this process on the chosen
world. `key_report` checks every key alone (the alias rewriting, then the schema), since a run stops at its first
error.

Deliberately simple: the shell reader knows what these scripts use (assignments, `${X:-default}`, `$((...))`,
backslash continuations, comments), not the shell; a variable the script does not set reads as `__NAME__`.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import io
import json
import operator
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

PEER_SCRIPTS = Path(__file__).resolve().parents[2] / "peer_scripts"
Peer = Literal["verl", "rllm", "roll", "trl", "openrlhf"]
PEERS: tuple[Peer, ...] = ("verl", "rllm", "roll", "trl", "openrlhf")
HEADER_END = "# kept verbatim below"
ROLL_FLAGS = ("--config_path", "--config_name")  # ROLL's own spelling, which the entrypoint takes
"""How a ROLL config is passed: ROLL's own scripts write --config_path / --config_name (underscores)."""
FLAG_PEERS = ("trl", "openrlhf")
"""Peers whose arguments are `--flag value` tokens (the rest take Hydra's `key=value`)."""


@dataclass(frozen=True)
class World:
    """The cluster a launch is planned for."""

    gpus_per_node: int
    nodes: int = 1

    @property
    def size(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass
class Launch:
    """What a peer's script passes its entrypoint, as a user would pass it to ours."""

    peer: Peer
    script: Path
    """The kept file (a shell script, or ROLL's YAML)."""
    args: list[str]
    """verl / rLLM: key=value overrides; TRL / OpenRLHF: --flag value tokens; ROLL: the config's directory and name."""
    world: World | None = None
    """The world chosen by `substitute`; None before."""
    substituted: list[tuple[str, str, str]] = field(default_factory=list)
    """(key, the script's value, ours) for every value `substitute` replaced."""
    added: list[str] = field(default_factory=list)
    """Arguments `substitute` added (data for a script whose data is defined in Python), as passed."""

    @property
    def name(self) -> str:
        """The script's path under tests/peer_scripts/ (the test's id)."""
        return (
            self.script.relative_to(PEER_SCRIPTS).as_posix()
            if self.script.is_relative_to(PEER_SCRIPTS)
            else str(self.script)
        )


# ---- reading a shell script --------------------------------------------------------------------------------------
def strip_header(text: str) -> str:
    """The original content of a kept file: what follows the header's `# kept verbatim below` line."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            break
        if line.startswith(HEADER_END):
            return "".join(lines[i + 1 :])
    return text


_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
    ast.Mod: operator.mod,
}


def _arith(expr: str, env: dict[str, str]) -> str:
    """`$((expr))`: integer + - * / % on numbers and the script's variables (with or without `$`)."""
    text = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", r"\1", expr)

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return int(env.get(node.id, "0") or 0)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(expr)

    try:
        return str(ev(ast.parse(text.strip(), mode="eval").body))
    except (ValueError, SyntaxError):
        return f"__ARITH({expr.strip()})__"


def _matching(text: str, i: int, open_: str, close: str) -> int:
    """The index just past the `close` that matches the `open_` at text[i]."""
    depth = 0
    while i < len(text):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _expand(text: str, i: int, env: dict[str, str]) -> tuple[str, int, bool]:
    """The expansion starting at text[i] == '$': (its value, the index past it, whether it was `$@`)."""
    rest = text[i + 1 :]
    if rest.startswith("(("):
        end = text.find("))", i + 3)
        end = len(text) if end < 0 else end
        return _arith(text[i + 3 : end], env), end + 2, False
    if rest.startswith("("):
        end = _matching(text, i + 1, "(", ")")
        return _COMMAND, end, False
    if rest.startswith("{"):
        end = _matching(text, i + 1, "{", "}")
        inner = text[i + 2 : end - 1]
        name, sep, default = inner.partition(":-")
        if name in env and (env[name] or not sep):
            return env[name], end, False
        if sep:
            return _words_text(default, env), end, False
        return _unset(name), end, False
    m = re.match(r"[A-Za-z_]\w*|[0-9@#?*$]", rest)
    if m is None:
        return "$", i + 1, False
    name = m.group(0)
    if name == "@":
        return "", i + 2, True
    return env.get(name, _unset(name)), i + 1 + len(name), False


def _unset(name: str) -> str:
    """A variable the script does not set: positional parameters are empty, others a placeholder."""
    return "" if name.isdigit() and name != "0" else f"__{name}__"


def _words_text(text: str, env: dict[str, str]) -> str:
    """`text` expanded as inside double quotes (a default value, an assignment's value)."""
    return " ".join(split_words(text, env)) if text.strip() else ""


END_OF_COMMAND = "\x00end"
_COMMAND = "\x00cmd"  # the value of a command substitution, $(...), which is not run


def split_words(line: str, env: dict[str, str]) -> list[str]:
    """One logical line as the shell splits it into words: quotes removed, variables expanded (word splitting of
    unquoted expansions included), a `#` at a word's start ending the line, `$@` dropped; a pipe, `;`, `&&` or `||`
    ends the command (the word END_OF_COMMAND marks it) and a redirection (`2>&1`, `> f`) is dropped."""
    words: list[str] = []
    cur: list[str] = []
    started = False  # the current word has begun (an empty quoted string is a word)
    i = 0

    def finish() -> None:
        nonlocal cur, started
        if started:
            words.append("".join(cur))
        cur, started = [], False

    while i < len(line):
        c = line[i]
        if c in " \t\n":
            finish()
            i += 1
        elif c == "#" and not started:
            break
        elif c == "'":
            end = line.find("'", i + 1)
            end = len(line) if end < 0 else end
            cur.append(line[i + 1 : end])
            started, i = True, end + 1
        elif c == '"':
            i += 1
            started = True
            while i < len(line) and line[i] != '"':
                if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in '"\\$`':
                    cur.append(line[i + 1])
                    i += 2
                elif line[i] == "$":
                    value, i, _ = _expand(line, i, env)
                    cur.append(value)
                else:
                    cur.append(line[i])
                    i += 1
            i += 1
        elif c == "\\" and i + 1 < len(line):
            cur.append(line[i + 1])
            started, i = True, i + 2
        elif c == "$":
            value, i, at = _expand(line, i, env)
            if at:
                continue
            parts = value.split()
            if value[:1].isspace():
                finish()
            for k, part in enumerate(parts):
                if k:
                    finish()
                cur.append(part)
                started = True
            if value[-1:].isspace():
                finish()
        elif c in "|;&":  # a pipe, a list or a background job: the command ends
            finish()
            words.append(END_OF_COMMAND)
            break
        elif c in "<>" or (c.isdigit() and not started and re.match(r"\d+[<>]", line[i:])):
            finish()
            m = re.match(r"\d*[<>]+&?\d*\s*", line[i:])
            assert m is not None
            i += m.end()
            if not m.group(0).rstrip().endswith(("&1", "&2")):
                while i < len(line) and not line[i].isspace():  # the redirection's target
                    i += 1
        else:
            cur.append(c)
            started, i = True, i + 1
    finish()
    return words


def logical_lines(text: str) -> Iterator[str]:
    """The script's lines with backslash continuations joined."""
    yield from text.replace("\\\r\n", "").replace("\\\n", "").splitlines()


_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)


def _entry_args(words: list[str]) -> list[str] | None:
    """The arguments after the peer's entrypoint in one command's words, or None when the command runs none."""
    if END_OF_COMMAND in words:
        words = words[: words.index(END_OF_COMMAND)]
    for i, w in enumerate(words):
        base = w.rsplit("/", 1)[-1]
        if base in ("python", "python3") and words[i + 1 : i + 2] == ["-m"] and len(words) > i + 2:
            module = words[i + 2]
            if module.startswith(("verl.", "recipe.", "examples.", "openrlhf.cli.")):
                return words[i + 3 :]
        if base == "trl" and len(words) > i + 1:
            return words[i + 2 :]
        if base == "accelerate" and words[i + 1 : i + 2] == ["launch"]:
            for j in range(i + 2, len(words)):
                if words[j].endswith(".py"):
                    return words[j + 1 :]
    return None


def read_shell(text: str) -> list[str]:
    """The arguments the script passes its entrypoint, after evaluating its variable assignments."""
    env: dict[str, str] = {}
    for line in logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        words = split_words(stripped, env)
        args = _entry_args(words)
        if args is not None:
            return args
        if words and words[0] in ("export", "local", "readonly"):
            words = words[1:]
        for w in words:
            m = _ASSIGN.match(w)
            if m is None:
                break
            name, value = m.group(1), m.group(2)
            env[name] = f"__{name}__" if _COMMAND in value else value  # X=$(...): not run here
    raise ValueError("no line runs the peer's entrypoint")


def peer_of(path: Path) -> Peer:
    """The peer a kept file belongs to: its first folder under tests/peer_scripts/."""
    part = path.resolve().relative_to(PEER_SCRIPTS).parts[0]
    for peer in PEERS:
        if part == peer:
            return peer
    raise ValueError(f"{path}: not under tests/peer_scripts/<{'|'.join(PEERS)}>/")


def read_launch(path: Path) -> Launch:
    """A kept file as a Launch: a shell script's entrypoint arguments, or ROLL's YAML as --config-path/--config-name."""
    path = path.resolve()
    peer = peer_of(path)
    if path.suffix in (".yaml", ".yml"):
        return Launch(peer, path, [ROLL_FLAGS[0], str(path.parent), ROLL_FLAGS[1], path.stem])
    return Launch(peer, path, read_shell(strip_header(path.read_text())))


def launches() -> list[Path]:
    """Every kept launch: the shell scripts, and ROLL's YAML configs (not the files their `defaults` name, nor the
    configs a verl script points --config-path at)."""
    out = sorted(PEER_SCRIPTS.glob("*/**/*.sh"))
    for yaml in sorted(PEER_SCRIPTS.glob("roll/**/*.yaml")):
        if yaml.parent.name != "config":
            out.append(yaml)
    return sorted(out)


# ---- arguments as (key, value) -----------------------------------------------------------------------------------
def pairs(launch: Launch) -> list[tuple[str, str]]:
    """The launch's arguments as (key, value): `key=value` overrides as they are; `--flag v` tokens as flag=v (no
    value: true, several: a list); ROLL's YAML flattened to its dotted leaves (hydra and defaults left out)."""
    if launch.peer == "roll":
        return _yaml_pairs(Path(launch.args[1]) / f"{launch.args[3]}.yaml")
    if launch.peer in FLAG_PEERS:
        return _flag_pairs(launch.args)
    out, it = [], iter(launch.args)
    for arg in it:
        key, eq, value = arg.partition("=")
        out.append((key, value if eq or not arg.startswith("-") else next(it, "")))
    return out


def _flag_pairs(tokens: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if tok.startswith("--"):
            key, eq, value = tok[2:].partition("=")
            out.append((key, [value] if eq else []))
        elif out:
            out[-1][1].append(tok)
    return [(k, "true" if not v else v[0] if len(v) == 1 else "[" + ",".join(v) + "]") for k, v in out]


def _yaml_pairs(path: Path) -> list[tuple[str, str]]:
    """The dotted leaves the file itself writes, valued as ROLL reads them: interpolations resolved over the files
    its `defaults` names (`../config/traj_envs@_here_`), where they resolve."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from torchrl_post.config.alias_table import render_value

    own = OmegaConf.load(path)
    assert isinstance(own, DictConfig)
    files = [f"{e.split('@')[0]}.yaml" for e in own.get("defaults") or [] if isinstance(e, str) and e != "_self_"]
    merged = OmegaConf.merge(*[OmegaConf.load(path.parent / f) for f in files], own)
    out: list[tuple[str, str]] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, DictConfig) and len(node):
            for k in node:
                walk(node._get_node(k), f"{prefix}{k!s}.")
            return
        key = prefix[:-1]
        try:
            value = OmegaConf.select(merged, key, throw_on_missing=True)
            value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except OmegaConfBaseException:
            value = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node._value()
        out.append((key, render_value(value)))

    walk(OmegaConf.masked_copy(own, [str(k) for k in own if k not in ("hydra", "defaults")]), "")
    return out


# ---- substitution: paths and cluster sizes -----------------------------------------------------------------------
@dataclass(frozen=True)
class Demo:
    """What a launch's paths become."""

    model: Path
    """The tiny model (a text model's path)."""
    vlm: Path
    """The tiny vision-language model (a VL model's path)."""
    moe: Path
    """The tiny mixture-of-experts model (an A3B / MoE model's path)."""
    train_files: Path
    val_files: Path
    out_dir: Path
    """Checkpoint and log directories go under it; ROLL's YAML copies too."""
    reward_model: Path | None = None
    """The tiny model as a sequence classifier (a reward model's path)."""


What = Literal[
    "model",
    "reward_model",
    "train",
    "val",
    "dir",
    "kept",
    "gpus",
    "nodes",
    "world",
    "device_mapping",
    "fsdp",
    "engines",
]

RULES: tuple[tuple[str, What], ...] = (
    # models: the tiny one of the same kind (`_model_for`)
    ("actor_rollout_ref.model.path", "model"),
    ("critic.model.path", "model"),
    ("reward_model.model.path", "reward_model"),
    ("reward.model_name_or_path", "reward_model"),
    ("pretrain", "model"),
    ("reward_pretrain", "model"),
    ("model_name_or_path", "model"),
    ("*.model_name_or_path", "model"),
    # data: the demo's rows
    ("data.train_files", "train"),
    ("dataset_name", "train"),
    ("data.prompt_dataset", "train"),
    ("actor_train.data_args.file_name", "train"),
    ("data.val_files", "val"),
    ("data.eval_dataset", "val"),
    ("validation.data_args.file_name", "val"),
    # where a run writes: a fresh directory
    ("trainer.default_local_dir", "dir"),
    ("output_dir", "dir"),
    ("*.output_dir", "dir"),
    ("logging_dir", "dir"),
    ("*.log_dir", "dir"),
    ("render_save_dir", "dir"),
    ("ckpt.path", "dir"),
    # files the script points at that are kept beside it
    ("--config-path", "kept"),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path", "kept"),
    ("reward.remote_url", "kept"),
    # the cluster
    ("trainer.n_gpus_per_node", "gpus"),
    ("trainer.nnodes", "nodes"),
    ("num_gpus_per_node", "gpus"),
    ("*.num_gpus_per_node", "gpus"),
    ("*.num_nodes", "nodes"),
    ("num_processes", "world"),
    ("rewards.*.world_size", "world"),
    ("*.device_mapping", "device_mapping"),
    ("*fsdp_size", "fsdp"),
    ("vllm.num_engines", "engines"),
)
"""Key (fnmatch, the whole dotted key; a flag without its dashes) -> what its value becomes. The first match wins."""

DEGREES = (
    "*tensor_model_parallel_size",
    "*tensor_parallel_size",
    "*ulysses_sequence_parallel_size",
    "*.ulysses_size",
    "*.num_gpus_per_worker",
)
"""Parallel degrees the script sets; the world is the smallest one (at least 2 GPUs, one node) they all fit."""


def _rule(key: str) -> What | None:
    for pattern, what in RULES:
        if fnmatch.fnmatchcase(key, pattern):
            return what
    return None


def _int(value: str) -> int | None:
    try:
        return int(value.strip("'\""))
    except ValueError:
        return None


WORLDS = {
    # ROLL steps the optimizer every 1 x 4 samples per data-parallel rank; at Ulysses 4, 4 ranks are one
    # data-parallel rank and a step would be half a group of 8, which a step here cannot be: 8 ranks make it one
    "roll/qwen3-30BA3B-rlvr_fsdp2/rlvr_config.yaml": 8,
}
"""Scripts that need more GPUs than their largest parallel degree for their batch arithmetic to hold."""


def choose_world(launch: Launch, least: int = 2) -> World:
    """One node with as many GPUs as the script's largest parallel degree (at least `least`; WORLDS' where given)."""
    degrees = [_int(v) for k, v in pairs(launch) if any(fnmatch.fnmatchcase(k, p) for p in DEGREES)]
    name = launch.script.relative_to(PEER_SCRIPTS).as_posix() if launch.script.is_relative_to(PEER_SCRIPTS) else ""
    return World(max([least, WORLDS.get(name, 0), *[d for d in degrees if d is not None]]))


def _model_for(original: str, demo: Demo) -> Path:
    """The tiny model of the original's kind, read from its name: VL -> the VLM, A3B / MoE -> the MoE."""
    if re.search(r"(^|[-_/])VL([-_]|$)", original, re.I):
        return demo.vlm
    if re.search(r"A\d+(\.\d+)?B|moe", original, re.I):
        return demo.moe
    return demo.model


def _kept(original: str, launch: Launch) -> str | None:
    """The copy kept beside the script of the file or folder `original` names (by its last path part)."""
    name = original.rstrip("/").rsplit("/", 1)[-1]
    root = PEER_SCRIPTS / launch.peer
    found = sorted(p for p in root.rglob(name) if p != launch.script)
    return str(found[0]) if found else None


def _new_value(key: str, value: str, launch: Launch, demo: Demo, world: World, tp: int) -> str | None:
    """The substituted value of `key` (None: kept as it is)."""
    what = _rule(key)
    if what is None or value.startswith("${"):  # an interpolation follows the key it names
        return None
    if what == "model":
        return str(_model_for(value, demo))
    if what == "reward_model":
        return str(demo.reward_model or demo.model)
    if what in ("train", "val"):
        return str(demo.train_files if what == "train" else demo.val_files)
    if what == "dir":
        return str(demo.out_dir / "run" / key.replace("*", "").strip(".-"))
    if what == "kept":
        return _kept(value, launch)
    sizes = {"gpus": world.gpus_per_node, "nodes": world.nodes, "world": world.size}
    if what in sizes:
        return str(sizes[what])
    if what == "device_mapping":
        return f"list(range(0,{world.size}))"
    if what == "fsdp":
        n = _int(value)
        return None if n is None or n <= 0 else str(world.size)
    return str(max(1, world.size // tp))  # engines


def substitute(launch: Launch, demo: Demo, world: World | None = None) -> Launch:
    """The launch with only paths and cluster sizes replaced (`RULES`); the world is `choose_world`'s unless given.
    A script that names no data (rLLM's are registered in Python) gets the demo's files added. ROLL's YAML is
    copied (with the files beside it) under demo.out_dir and rewritten there."""
    world = world or choose_world(launch)
    tp = max([1, *[_int(v) or 1 for k, v in pairs(launch) if k == "vllm.tensor_parallel_size"]])
    if launch.peer == "roll":
        return _substitute_yaml(launch, demo, world, tp)
    done: list[tuple[str, str, str]] = []
    args = list(launch.args)
    for i, tok in enumerate(launch.args):
        flags = launch.peer in FLAG_PEERS or tok.startswith("-")
        if flags and not tok.startswith("-"):
            continue  # a flag's value: replaced with its flag
        head, eq, value = tok.partition("=")
        at, prefix = i, f"{head}="
        if flags and not eq:
            if i + 1 == len(args) or args[i + 1].startswith("--"):
                continue  # a flag without a value
            at, prefix, value = i + 1, "", args[i + 1]
        key = head[2:] if launch.peer in FLAG_PEERS else head.lstrip("+~")
        new = _new_value(key, value, launch, demo, world, tp) if eq or flags else None
        if new is not None:
            done.append((key, value, new))
            args[at] = prefix + new
    added: list[str] = []
    if not any(_rule(k.lstrip("+~")) == "train" for k, _, _ in done):
        data = {"data.train_files": str(demo.train_files), "data.val_files": str(demo.val_files)}
        for key, value in data.items():
            added += [f"--{key}", value] if launch.peer in FLAG_PEERS else [f"{key}={value}"]
    return replace(launch, args=args + added, world=world, substituted=done, added=added)


def _substitute_yaml(launch: Launch, demo: Demo, world: World, tp: int) -> Launch:
    from omegaconf import OmegaConf

    copy = Path(tempfile.mkdtemp(prefix="roll_", dir=demo.out_dir))
    shutil.copytree(PEER_SCRIPTS / "roll", copy, dirs_exist_ok=True)
    primary = copy / launch.script.relative_to(PEER_SCRIPTS / "roll")
    data = OmegaConf.to_container(OmegaConf.load(primary), resolve=False)
    assert isinstance(data, dict)
    done: list[tuple[str, str, str]] = []

    def walk(node: dict[Any, Any], prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k!s}"
            if isinstance(v, dict):
                walk(v, key + ".")
                continue
            shown = "[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else str(v)
            new = _new_value(key, shown, launch, demo, world, tp)
            if new is None:
                continue
            done.append((key, shown, new))
            node[k] = [new] if isinstance(v, list) else _yaml_scalar(new)

    walk(data, "")
    OmegaConf.save(OmegaConf.create(data), primary)
    args = [ROLL_FLAGS[0], str(primary.parent), ROLL_FLAGS[1], primary.stem]
    return replace(launch, args=args, world=world, substituted=done, added=[])


def _yaml_scalar(text: str) -> Any:
    n = _int(text)
    return n if n is not None else text


# ---- the dry run -------------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    """What our entrypoint's dry run said about a launch."""

    accepted: bool
    error: str = ""
    """The one error line (`error: ...` without its prefix); empty when accepted."""
    notes: list[str] = field(default_factory=list)
    """The `note:` lines printed (aliases rewritten, the plan's notes)."""
    output: str = ""

    def __str__(self) -> str:
        return "accepted" if self.accepted else f"refused: {self.error}"

    def matches(self, expected: str) -> bool:
        """`expected` is "accepted" or "refused: <a part of the error line>"."""
        if expected == "accepted":
            return self.accepted
        return not self.accepted and expected.removeprefix("refused:").strip() in self.error


WORLD_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@contextlib.contextmanager
def world_env(world: World) -> Iterator[None]:
    """torchrun's variables for rank 0 of `world`, restored after."""
    saved = {k: os.environ.get(k) for k in WORLD_VARS}
    os.environ.update(WORLD_SIZE=str(world.size), RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(world.gpus_per_node))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def dry_run(launch: Launch) -> Verdict:
    """`torchrl_post.train`'s dry run of the launch's arguments, in this process, as rank 0 of its world."""
    from torchrl_post import api
    from torchrl_post.config import UserError
    from torchrl_post.config.load import load_command_line

    out = io.StringIO()
    error = ""
    with world_env(launch.world or World(1)), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        notes: list[str] = []
        try:
            cfg = load_command_line([*launch.args, "trainer.dry_run=true"], notes)
            api.run(cfg, notes=notes, process_ends=False)
        except UserError as e:
            api.report_error(e)
            error = " ".join(str(e).split())
        except Exception as e:  # not a refusal: a crash of the entrypoint on this launch
            error = f"crash: {type(e).__name__}: {' '.join(str(e).split())}"
    text = out.getvalue()
    printed = [line.removeprefix("note: ") for line in text.splitlines() if line.startswith("note: ")]
    return Verdict(not error, error, printed, text)


# ---- key by key --------------------------------------------------------------------------------------------------
Status = Literal["ours", "alias", "noop", "unknown", "refused", "flag"]


@dataclass(frozen=True)
class KeyCheck:
    key: str
    value: str
    status: Status
    """ours: our key; alias: rewritten to ours; noop: accepted, changes nothing; unknown / refused: an error."""
    message: str = ""


def check_key(key: str, value: str) -> KeyCheck:
    """One `key=value` alone through the command line's checks: its syntax, the alias rewriting, the schema, then
    the config composed with it alone over the default one (its value's type and bounds)."""
    from torchrl_post.config import ConfigError
    from torchrl_post.config.aliases import rewrite_overrides
    from torchrl_post.config.load import check_keys, check_override_syntax, load_config

    if key.startswith("-"):
        return KeyCheck(key, value, "flag", "the entrypoint's own flag")
    arg = f"{key}={value}"
    try:
        check_override_syntax(arg)
        rewritten, notes = rewrite_overrides([arg])
        check_keys(rewritten)
        load_config([arg])
    except ConfigError as e:
        message = " ".join(str(e).split())
        return KeyCheck(key, value, "unknown" if "unknown config key" in message else "refused", message)
    if not notes:
        return KeyCheck(key, value, "ours")
    return KeyCheck(key, value, "alias" if rewritten else "noop", notes[0])


def key_report(launch: Launch) -> list[KeyCheck]:
    """Every key of the launch checked alone (`check_key`); the arguments `substitute` added are left out."""
    own = replace(launch, args=launch.args[: len(launch.args) - len(launch.added)])
    return [check_key(k, v) for k, v in pairs(own)]


def understood(checks: list[KeyCheck]) -> int:
    return sum(c.status in ("ours", "alias", "noop") for c in checks)


# ---- the report --------------------------------------------------------------------------------------------------
POSITIONS = 32768
"""max_position_embeddings of the tiny models a launch gets (Qwen2.5's): the scripts' prompt + response lengths fit,
as they do the models they name (the fixtures' tiny models have 256)."""


HEADS = {"num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 8, "hidden_size": 320}
"""The attention heads a dry run's tiny models declare (Qwen2.5-32B's 40 and 8): the scripts' Ulysses sizes (up to
8) divide them, as they do the models they name. Only a dry run may use them: the weights have the fixtures' 2."""


def make_demo(
    model: Path, vlm: Path, moe: Path, train_files: Path, val_files: Path, out_dir: Path, dry: bool = True
) -> Demo:
    """A Demo of copies of the tiny models under `out_dir`, each with POSITIONS positions and, for a dry run (`dry`),
    HEADS heads (their config.json only)."""
    copies = []
    for src in (model, vlm, moe):
        dst = out_dir / "models" / src.name
        shutil.copytree(src, dst)
        config_json = dst / "config.json"
        config = json.loads(config_json.read_text())
        for section in (config, config.get("text_config") or {}):
            if "max_position_embeddings" in section:
                section["max_position_embeddings"] = POSITIONS
            if dry and "num_attention_heads" in section:
                section.update(HEADS)
        config_json.write_text(json.dumps(config, indent=2))
        copies.append(dst)
    reward_model = out_dir / "models" / "reward_model"  # the tiny model read as a sequence classifier
    shutil.copytree(copies[0], reward_model)
    config = json.loads((reward_model / "config.json").read_text())
    config |= {"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 1}
    (reward_model / "config.json").write_text(json.dumps(config, indent=2))
    return Demo(copies[0], copies[1], copies[2], train_files, val_files, out_dir, reward_model)


def build_demo(root: Path) -> Demo:
    """The tiny models and the demo's rows under `root` (the test's fixtures build the same)."""
    from tests.conftest import build_tiny_moe
    from torchrl_post.demo.build import build_tiny_model
    from torchrl_post.demo.task import write_task
    from torchrl_post.demo.vlm import build_vlm

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        build_tiny_model(
            root / "model", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
        )
        build_tiny_moe(root / "moe")
        build_vlm(root / "vlm", "qwen2_5_vl")
        train, val = write_task(root / "data")
    (root / "out").mkdir()
    return make_demo(root / "model", root / "vlm", root / "moe", train, val, root / "out")


def _cell(text: str, limit: int = 160) -> str:
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.replace("|", "\\|")


def report(demo: Demo) -> str:
    """The markdown table (one row per launch), then every unknown or refused key with the scripts it is in."""
    rows = [
        "| script | peer | world | keys | understood | verdict |",
        "|---|---|---|---|---|---|",
    ]
    todo: dict[tuple[str, Status], list[tuple[str, str]]] = {}
    for path in launches():
        launch = substitute(read_launch(path), demo)
        checks = [c for c in key_report(launch) if c.status != "flag"]
        verdict = dry_run(launch)
        world = launch.world or World(1)
        rows.append(
            f"| {launch.name} | {launch.peer} | {world.gpus_per_node}x{world.nodes} | {len(checks)} | "
            f"{understood(checks)} | {_cell(str(verdict), 240)} |"
        )
        for c in checks:
            if c.status in ("unknown", "refused"):
                todo.setdefault((c.key, c.status), []).append((launch.name, c.message))
    lines = ["## Verdicts", "", *rows, "", "## Keys not understood (by key; each checked alone)", ""]
    lines += ["| key | status | scripts | count | message (first) |", "|---|---|---|---|---|"]
    for (key, status), where in sorted(todo.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        names = ", ".join(sorted({n for n, _ in where}))
        lines.append(f"| `{key}` | {status} | {_cell(names, 400)} | {len(where)} | {_cell(where[0][1], 300)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="peer_scripts_") as tmp:
        sys.stdout.write(report(build_demo(Path(tmp))))


if __name__ == "__main__":
    main()
