"""The config reference, `docs/config.md`, generated from the schema's dataclasses and their field docstrings.

python -m torchrl_post.config.docs            # rewrite docs/config.md
python -m torchrl_post.config.docs --check    # exit 1 when docs/config.md is out of date
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

from torchrl_post.config import schema
from torchrl_post.config.validate import enum_fields

OUT = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def field_docs() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the string literal under the field in schema.py."""
    tree = ast.parse(Path(schema.__file__).read_text())
    docs: dict[tuple[str, str], str] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        body = cls.body
        for a, b in zip(body, body[1:], strict=False):
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                docs[(cls.name, a.target.id)] = " ".join(b.value.value.split())
    return docs


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _type_name(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return str(text).replace("typing.", "")


def _type_shown(tp: Any, values: tuple[str | None, ...] | None) -> str:
    """The type column: the type, or an enum key's values (`list of` them for a list)."""
    if values is None:
        return f"`{_type_name(tp)}`"
    names = " \\| ".join(f"`{'null' if v is None else v}`" for v in values)
    return f"list of {names}" if typing.get_origin(tp) is list else names


def rows(cls: type, prefix: str, docs: dict[tuple[str, str], str], hints: dict[str, Any] | None = None) -> list[str]:
    """One markdown row per leaf key under `cls`, sections (nested dataclasses) expanded in place."""
    out: list[str] = []
    hints, enums = typing.get_type_hints(cls, vars(schema)), enum_fields(cls)
    for f in dataclasses.fields(cls):
        key, tp, default = f"{prefix}{f.name}", hints[f.name], _default(f)
        if dataclasses.is_dataclass(tp):
            out += rows(tp, f"{key}.", docs)  # type: ignore[arg-type]
            continue
        doc = docs.get((cls.__name__, f.name), "").replace("|", "\\|")
        shown = "null" if default is None else repr(default).replace("|", "\\|")
        out.append(f"| `{key}` | {_type_shown(tp, enums.get(f.name))} | `{shown}` | {doc} |")
    return out


def render() -> str:
    docs = field_docs()
    lines = [
        "# Config reference",
        "",
        "Generated from `torchrl_post/config/schema.py` by `python -m torchrl_post.config.docs`; a test keeps it",
        "current. Set any key on the command line as `key=value` (Hydra overrides), or in a YAML file under",
        "`--config-path` that starts from ours (`defaults: [config, _self_]`).",
        "",
    ]
    for f in dataclasses.fields(schema.Config):
        section = typing.get_type_hints(schema.Config, vars(schema))[f.name]
        lines += [f"## {f.name}", "", "| key | type | default | what it does |", "|---|---|---|---|"]
        lines += rows(section, f"{f.name}.", docs)
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/config.md is out of date")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"error: {args.out} is out of date; run python -m torchrl_post.config.docs", file=sys.stderr)
            sys.exit(1)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
