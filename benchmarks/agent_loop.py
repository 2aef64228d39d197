"""Agent-loop benchmark: step-wise turns against one batch per turn, and the sandbox's cost per call.

    python -m benchmarks --only agent_loop [--quick | --tiny]
    python -m benchmarks.agent_loop [--quick] [--repeats R] [--env-workers W] [--omp-threads T]

1. Runs benchmarks/agent_loop_worker.py under torchrun (1 process, a real in-process vLLM engine on the demo
   model, built first with torchrl_post.demo.build when missing): the guess-number environment with a step
   that sleeps 0 ms and 50 ms (standing for a tool), through `AgentLoop(turn_batches=False)` (the step loop:
   a trajectory's next turn starts as soon as its environment answered) and `turn_batches=True` (every
   trajectory's turn and environment call finish before the next turns start), env_workers=8, the same tasks
   and seed: 32 tasks x n=2, max_turns 4, 6 tokens per turn, temperature 1 (`--quick`: 8 tasks). Median of
   R repeats after a warm-up.
2. Times the built-in tools in this process: `python("print(1)")` (bubblewrap sandbox) against a plain
   `subprocess.run` of the same code (the venv's interpreter and the sandbox's), and `calculator`.
`--tiny`: 2 tasks, one repeat, 2 calls per tool (tests).

The engine runs with `--omp-threads` OpenMP threads, unbound (default 1): on a few CPU cores shared with other
jobs, vLLM's default of one pinned thread per core makes single engine steps stall 10x whenever another
process runs on a pinned core; 0 keeps vLLM's defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import LOGS, ROOT, torchrun, warn_if_busy

NAME = "agent_loop"
WORKER = Path(__file__).resolve().parent / "agent_loop_worker.py"
DEMO_MODEL = ROOT / "outputs" / "demo_model"
DEMO_DATA = ROOT / "outputs" / "demo_data"
MODES = ("step", "turn_batches")
LABELS = {"step": "step loop", "turn_batches": "one batch per turn"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 tasks instead of 32, 10 sandbox calls instead of 20")
    ap.add_argument("--tiny", action="store_true", help="2 tasks, one repeat, 2 calls per tool (tests)")
    ap.add_argument("--repeats", type=int, default=None, help="default 3, --tiny 1")
    ap.add_argument("--tasks", type=int, default=None, help="tasks (default 32, --quick 8, --tiny 2)")
    ap.add_argument("--n", type=int, default=2, help="trajectories per task")
    ap.add_argument("--delays-ms", default="0,50")
    ap.add_argument("--env-workers", type=int, default=32, help="the loop's environment threads")
    ap.add_argument("--calls", type=int, default=None, help="timed calls per tool (default 20, --quick 10, --tiny 2)")
    ap.add_argument("--omp-threads", type=int, default=1, help="engine OpenMP threads, unbound; 0: vLLM's default")
    ap.add_argument("--results", type=Path, default=common.RESULTS)
    return ap.parse_args(argv)


def demo_model() -> Path:
    if not (DEMO_MODEL / "demo_build.json").is_file():
        from torchrl_post.demo.build import build_demo

        print("building the demo model (once) ...", flush=True)
        build_demo(DEMO_MODEL, DEMO_DATA)
    return DEMO_MODEL


# ---- 1. the agent loop ----------------------------------------------------------------------------------------


def run_loop(args: argparse.Namespace, tasks: int) -> dict[str, Any]:
    LOGS.mkdir(parents=True, exist_ok=True)
    out, log = LOGS / "agent_loop.json", LOGS / "agent_loop.log"
    out.unlink(missing_ok=True)
    cmd = [
        *torchrun(),
        "--standalone",
        "--nproc-per-node",
        "1",
        str(WORKER),
        *("--model", str(demo_model()), "--data", str(DEMO_DATA / "train.jsonl")),
        *("--tasks", str(tasks), "--samples", str(args.n)),
        *("--repeats", str(args.repeats), "--delays-ms", args.delays_ms, "--out", str(out)),
        *("--env-workers", str(args.env_workers)),
    ]
    env = dict(os.environ)
    if args.omp_threads > 0:
        env.update(OMP_NUM_THREADS=str(args.omp_threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    print(f"agent loop: {tasks} tasks x n={args.n}, {args.repeats} repeats (log {log}) ...", flush=True)
    warn_if_busy()
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"agent loop worker failed (exit {proc.returncode}); log {log}:\n{tail}")
    rec: dict[str, Any] = json.loads(out.read_text())
    rec["omp_threads"] = args.omp_threads or "vllm default (bound)"
    rec["worker_s"] = time.perf_counter() - t0
    rec["loadavg_1m"] = common.load_1m()
    for s in rec["summary"]:
        print(
            f"    {s['delay_ms']:>4g} ms {LABELS[s['mode']]:>18}: {s['trajectories_per_s']:6.1f} traj/s, "
            f"{s['engine_steps']:g} engine steps, {s['wall_s']:.2f} s, {s['mean_turns']:.2f} turns",
            flush=True,
        )
    return rec


# ---- 2. the sandbox -------------------------------------------------------------------------------------------


def median_s(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    fn()  # warm-up
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def bench_tools(calls: int) -> dict[str, Any]:
    from torchrl_post.tools.builtin import calculator, python
    from torchrl_post.tools.sandbox import SandboxLimits, SandboxUnavailable

    interp = SandboxLimits().interpreter
    code = "print(1)"
    res: dict[str, Any] = {"calls": calls, "code": code, "sandbox_interpreter": interp}
    res["plain_subprocess"] = median_s(
        lambda: subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, check=True), calls
    )
    if Path(interp).exists():
        res["plain_subprocess_sandbox_interpreter"] = median_s(
            lambda: subprocess.run([interp, "-I", "-c", code], capture_output=True, check=True), calls
        )
    res["calculator"] = median_s(lambda: calculator("123456+654321"), calls)
    try:
        if python(code).strip() != "1":
            raise SandboxUnavailable(f"python({code!r}) returned {python(code)!r}")
        res["sandbox"] = median_s(lambda: python(code), calls)
        res["sandbox_available"] = True
        base = res.get("plain_subprocess_sandbox_interpreter", res["plain_subprocess"])
        res["sandbox_overhead_s"] = res["sandbox"]["median_s"] - base["median_s"]
    except SandboxUnavailable as e:
        res["sandbox_available"] = False
        res["sandbox_unavailable"] = str(e)
    return res


def print_tools(t: dict[str, Any]) -> None:
    def ms(key: str) -> str:
        return f"{t[key]['median_s'] * 1e3:.2f} ms" if key in t else "n/a"

    sandbox = ms("sandbox") if t["sandbox_available"] else f"unavailable ({t['sandbox_unavailable']})"
    print(
        f"    python() sandboxed {sandbox}, plain subprocess {ms('plain_subprocess')} (venv), "
        f"{ms('plain_subprocess_sandbox_interpreter')} (sandbox's interpreter), calculator {ms('calculator')}",
        flush=True,
    )


# ---- reports --------------------------------------------------------------------------------------------------


def row(loop: dict[str, Any], delay: float, mode: str) -> dict[str, Any]:
    return next(s for s in loop["summary"] if s["delay_ms"] == delay and s["mode"] == mode)


def delays_of(loop: dict[str, Any]) -> list[float]:
    return sorted({s["delay_ms"] for s in loop["summary"]})


def markdown(rec: dict[str, Any]) -> str:
    loop, tools, m = rec["agent_loop"], rec["tools"], rec["machine"]
    same = {c["delay_ms"]: c for c in loop["mode_comparison"]}
    lines = [
        "# Agent-loop benchmark",
        "",
        f"{m['cpu_count']} CPUs (shared with other jobs; load average {loop['loadavg_1m']:.1f} at the end), "
        f"torch {m['torch']}, vllm {m['vllm']}; in-process vLLM on `{loop['model']}`, engine OpenMP threads: "
        f"{loop['omp_threads']}. Guess-number environment on the demo questions (each env step sleeps between 0 "
        "and twice the listed mean, seeded per task and turn, as tool latencies vary), "
        f"{loop['tasks']} tasks x n={loop['n']} = "
        f"{loop['tasks'] * loop['n']} trajectories, max_turns {loop['max_turns']}, "
        f"{loop['max_tokens_per_turn']} tokens per turn, temperature {loop['temperature']}, seed {loop['seed']}, "
        f"env_workers {loop['env_workers']}. Median of {rec['repeats']} repeats after a warm-up; the prefix cache "
        "is emptied before each run.",
        "",
        "| env step | mode | traj/s | engine steps | wall s | env floor s | mean turns | same responses as the other mode |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in delays_of(loop):
        for mode in MODES:
            s = row(loop, d, mode)
            lines.append(
                f"| {d:g} ms | {LABELS[mode]} | {s['trajectories_per_s']:.1f} | {s['engine_steps']:g} | "
                f"{s['wall_s']:.2f} | {s['env_floor_s']:.2f} | {s['mean_turns']:.2f} | {same[d]['identical_fraction']:.0%} |"
            )
    lines += [
        "",
        "`env floor`: the run's environment calls alone, spread over the env_workers threads (turns x step / "
        "threads); no schedule of the turns finishes sooner. `same responses`: the share of trajectories whose "
        "response tokens are equal in both modes (same seeds; the engine's batches differ).",
    ]
    lines += ["", "| tool call | median ms | min ms | max ms |", "|---|---|---|---|"]
    names = {
        "sandbox": '`python("print(1)")` (bubblewrap sandbox)',
        "plain_subprocess": "plain `subprocess.run` (venv interpreter, `-I`)",
        "plain_subprocess_sandbox_interpreter": "plain `subprocess.run` (the sandbox's interpreter, `-I`)",
        "calculator": '`calculator("123456+654321")`',
    }
    for key, name in names.items():
        if key in tools:
            t = tools[key]
            lines.append(f"| {name} | {t['median_s'] * 1e3:.3f} | {t['min_s'] * 1e3:.3f} | {t['max_s'] * 1e3:.3f} |")
    if not tools["sandbox_available"]:
        lines.append(f"| sandbox | unavailable: {tools['sandbox_unavailable']} | | |")
    lines += ["", *conclusion(rec), ""]
    return "\n".join(lines)


def conclusion(rec: dict[str, Any]) -> list[str]:
    loop, tools = rec["agent_loop"], rec["tools"]
    parts = []
    for d in delays_of(loop):
        a, b = row(loop, d, "step"), row(loop, d, "turn_batches")
        parts.append(
            f"{a['trajectories_per_s'] / b['trajectories_per_s']:.2f}x the trajectories/s of one batch per turn "
            f"with a {d:g} ms environment step ({a['engine_steps']:g} vs {b['engine_steps']:g} engine steps)"
        )
    first = "The step loop runs " + "; ".join(parts) + "."
    if tools["sandbox_available"]:
        second = (
            f"A sandboxed `python` call costs {tools['sandbox']['median_s'] * 1e3:.1f} ms, "
            f"{tools['sandbox_overhead_s'] * 1e3:+.1f} ms over a plain interpreter start; "
            f"`calculator` {tools['calculator']['median_s'] * 1e6:.0f} us."
        )
    else:
        second = f"The sandbox could not be timed: {tools['sandbox_unavailable']}."
    return [first, second]


def plot(path: Path, rec: dict[str, Any]) -> None:
    plt = common.pyplot()

    loop = rec["agent_loop"]
    delays = delays_of(loop)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.38
    for i, mode in enumerate(MODES):
        xs = [k + (i - 0.5) * width for k in range(len(delays))]
        tps = [row(loop, d, mode)["trajectories_per_s"] for d in delays]
        steps = [row(loop, d, mode)["engine_steps"] for d in delays]
        for ax, ys, fmt in ((left, tps, "{:.1f}"), (right, steps, "{:g}")):
            bars = ax.bar(xs, ys, width, label=LABELS[mode], color=f"C{i}")
            ax.bar_label(bars, [fmt.format(y) for y in ys], fontsize=8)
    for ax, ylabel, title in (
        (left, "trajectories / s", "throughput (median)"),
        (right, "engine steps", "engine steps per run (median)"),
    ):
        ax.set_xticks(range(len(delays)), [f"env step {d:g} ms" for d in delays])
        ax.set(ylabel=ylabel, title=title)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"agent loop, {loop['tasks']} tasks x n={loop['n']}, {loop['max_turns']} turns x "
        f"{loop['max_tokens_per_turn']} tokens, env_workers {loop['env_workers']}",
        fontsize=10,
    )
    common.save_figure(fig, path)


# ---- main -----------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    args = common.options(args, parse_args)
    args.repeats = args.repeats or (1 if args.tiny else 3)
    tasks = args.tasks or (2 if args.tiny else 8 if args.quick else 32)
    calls = args.calls or (2 if args.tiny else 10 if args.quick else 20)
    loop = run_loop(args, tasks)
    print(f"sandbox: {calls} calls each ...", flush=True)
    tools = bench_tools(calls)
    print_tools(tools)
    rec = {"repeats": args.repeats, "quick": args.quick, "tiny": args.tiny, "agent_loop": loop, "tools": tools}
    for line in conclusion(rec):
        print(f"  {line}", flush=True)
    return rec


def main(argv: list[str] | None = None) -> None:
    common.standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
