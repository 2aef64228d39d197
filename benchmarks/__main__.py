"""The benchmark suite: run every benchmark (or some), write each result, and summarize the newest ones.

    python -m benchmarks [--quick] [--tiny] [--report-only] [--only NAME[,NAME]] [--results DIR]

A benchmark that fails is reported and the others still run (exit status 1); docs/benchmarks.md has the rest.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from benchmarks import common

BENCHMARKS = (
    "sync", "rollout", "update", "e2e", "memory", "loading", "lora", "agent_loop", "loss_path", "sequence_parallel",
    "moe_experts", "moe_routing", "async_rollout", "reward_model", "sft", "expert_parallel",
)  # fmt: skip
PAGE = common.ROOT / "docs" / "benchmarks.md"  # the docs site's benchmark page
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = common.parser(__doc__, {
        "--report-only": {"action": "store_true", "help": "rebuild the .md and .png from the JSON files"},
        "--only": {"default": "", "help": f"comma-separated names of {', '.join(BENCHMARKS)}"},
    })  # fmt: skip
    ap.prog = "python -m benchmarks"
    args = ap.parse_args(argv)
    args.only = [n.strip() for n in args.only.split(",") if n.strip()]
    if unknown := [n for n in args.only if n not in BENCHMARKS]:
        ap.error(f"--only: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    return args


def measure(args: argparse.Namespace, names: list[str]) -> list[str]:
    """Run each benchmark and write its report; returns the names that failed."""
    failed, start = [], time.perf_counter()
    for i, name in enumerate(names, 1):
        module, t0 = importlib.import_module(f"benchmarks.{name}"), time.perf_counter()
        print(f"[{i}/{len(names)}] {name} (load average {common.load_1m():.1f}) ...", flush=True)
        try:
            rec = module.run(common.options(args, getattr(module, "OPTIONS", {})))
            path = common.write_report(args.results, module.NAME, rec, module.markdown, module.plot)
        except (Exception, SystemExit) as e:  # one benchmark's failure must not cost the others
            failed.append(name)
            detail = str(e) if isinstance(e, SystemExit) else traceback.format_exc()
            print(f"[{i}/{len(names)}] {name} FAILED after {time.perf_counter() - t0:.0f} s:\n{detail}", flush=True)
            continue
        now = time.perf_counter()
        print(f"[{i}/{len(names)}] {name} done in {now - t0:.0f} s (total {now - start:.0f} s): {path}", flush=True)
    return failed


def rebuild(args: argparse.Namespace, names: list[str]) -> list[str]:
    """Every JSON's .md and .png again, dispatched on its `benchmark` field; returns the names that failed."""
    failed = []
    for path in sorted(args.results.glob("*.json")):
        name = json.loads(path.read_text()).get("benchmark")
        if name not in names:
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        try:
            common.render(path, module.markdown, module.plot)
            print(f"rebuilt {path.with_suffix('.md').name} and .png", flush=True)
        except Exception:
            failed.append(name)
            print(f"{path.name}: FAILED to render:\n{traceback.format_exc()}", flush=True)
    return failed


def newest(results: Path, name: str, tag: str) -> Path | None:
    """The benchmark's newest result: this machine's latest if it has one, else the latest of any machine's."""
    found = []
    for path in results.glob(f"{name}_*.json"):
        rec = json.loads(path.read_text())
        if rec.get("benchmark") == name:
            found.append((common.machine_tag(rec["machine"]) == tag, rec["date"], path.name, path))
    return max(found)[3] if found else None


def demote(md: str, levels: int = 1) -> str:
    """Headings `levels` deeper (a result's `# Title` becomes `## Title` on docs/benchmarks.md)."""
    return "\n".join("#" * levels + line if line.startswith("#") else line for line in md.splitlines())


def latest(results: Path, link_prefix: str) -> str:
    """Each benchmark's newest result, its markdown under a link to its files (`link_prefix` + the file name)."""
    tag = common.machine_tag()
    parts = []
    for name in BENCHMARKS:
        path = newest(results, name, tag)
        if path is None:
            continue
        rec = json.loads(path.read_text())
        md = path.with_suffix(".md").read_text() if path.with_suffix(".md").is_file() else ""
        m, stem = rec["machine"], link_prefix + path.stem
        where = f"{m['cpu']}, {m['cpu_count']} cores" + (f", {m['gpu']}" if m.get("gpu") else "")
        parts.append(
            f"{demote(md).rstrip()}\n\n_{rec['date']}, {where}: [{path.stem}.md]({stem}.md), "
            f"[plot]({stem}.png), [record]({stem}.json)._\n"
        )
    return "\n".join(parts) if parts else "No benchmark results yet: run `make bench-quick`.\n"


def write_latest(results: Path) -> None:
    """<results>/LATEST.md; docs/benchmarks.md's generated section too when `results` is the repository's own."""
    body = latest(results, "")
    (results / "LATEST.md").write_text(
        "# Latest benchmark results\n\nWritten by `python -m benchmarks` (also with `--report-only`): each "
        "benchmark's newest result, this machine's preferred.\n\n" + body
    )
    print(f"wrote {results / 'LATEST.md'}", flush=True)
    if results.resolve() != common.RESULTS.resolve():
        return
    readme = PAGE.read_text()
    if BEGIN not in readme or END not in readme:
        print(f"docs/benchmarks.md has no {BEGIN} ... {END} section; left as it is", flush=True)
        return
    head, rest = readme.split(BEGIN, 1)
    # docs/results links to benchmarks/results
    PAGE.write_text(f"{head}{BEGIN}\n{latest(results, 'results/').rstrip()}\n{END}{rest.split(END, 1)[1]}")
    print("updated docs/benchmarks.md's generated section", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.only or list(BENCHMARKS)
    args.results.mkdir(parents=True, exist_ok=True)
    common.LOGS.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        failed = rebuild(args, names)
    else:
        print(f"benchmarks ({common.mode(args)}): {', '.join(names)}; results in {args.results}", flush=True)
        failed = measure(args, names)
    write_latest(args.results)
    if failed:
        print(f"failed: {', '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
