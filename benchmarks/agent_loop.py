"""Agent-loop benchmark: step-wise turns against one batch per turn, and the sandbox's cost per call.

benchmarks/agent_loop_worker.py (in-process vLLM on the demo model) runs the guess-number environment, its step
sleeping 0 and 50 ms on average, through `AgentLoop(turn_batches=False)` and `True`; then the built-in tools are
timed here: `python("print(1)")` (bubblewrap sandbox) against a plain `subprocess.run`, and `calculator`.
Tasks, repeats and calls per mode: SETTINGS.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import DEMO_DATA, demo_model

NAME = "agent_loop"
WORKER = Path(__file__).resolve().parent / "agent_loop_worker.py"
MODES = ("step", "turn_batches")
LABELS = {"step": "step loop", "turn_batches": "one batch per turn"}
SETTINGS = {"full": (32, 3, 20), "quick": (8, 3, 10), "tiny": (2, 1, 2)}  # tasks, repeats, timed calls per tool
N, DELAYS_MS, ENV_WORKERS, OMP_THREADS = 2, "0,50", 32, 1  # trajectories per task, env step delays, threads


def run_loop(tasks: int, repeats: int) -> dict[str, Any]:
    args = {
        "model": demo_model(), "data": DEMO_DATA / "train.jsonl", "tasks": tasks, "samples": N, "repeats": repeats,
        "delays_ms": DELAYS_MS, "env_workers": ENV_WORKERS,
    }  # fmt: skip
    # The engine's OpenMP threads unbound: on shared cores vLLM's pinned thread per core stalls 10x at times.
    env = {"OMP_NUM_THREADS": str(OMP_THREADS), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    print(f"agent loop: {tasks} tasks x n={N}, {repeats} repeats ...", flush=True)
    t0 = time.perf_counter()
    rec: dict[str, Any] = common.run_worker("agent_loop", WORKER, 1, args, env)
    return rec | {"omp_threads": OMP_THREADS, "worker_s": time.perf_counter() - t0}


def bench_tools(calls: int) -> dict[str, Any]:
    from torchrl_post.tools.builtin import calculator, python
    from torchrl_post.tools.sandbox import SandboxLimits, SandboxUnavailable

    def median_s(fn: Callable[[], Any]) -> dict[str, float]:
        times = [t[0] for t in common.take_turns({"fn": fn}, calls)["fn"]]
        return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}

    interp, code = SandboxLimits().interpreter, "print(1)"
    res: dict[str, Any] = {"calls": calls, "code": code, "sandbox_interpreter": interp}
    res["plain_subprocess"] = median_s(
        lambda: subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, check=True)
    )
    if Path(interp).exists():
        res["plain_subprocess_sandbox_interpreter"] = median_s(
            lambda: subprocess.run([interp, "-I", "-c", code], capture_output=True, check=True)
        )
    res["calculator"] = median_s(lambda: calculator("123456+654321"))
    try:
        if python(code).strip() != "1":
            raise SandboxUnavailable(f"python({code!r}) returned {python(code)!r}")
        res["sandbox"] = median_s(lambda: python(code))
        res["sandbox_available"] = True
        base = res.get("plain_subprocess_sandbox_interpreter", res["plain_subprocess"])
        res["sandbox_overhead_s"] = res["sandbox"]["median_s"] - base["median_s"]
    except SandboxUnavailable as e:
        res["sandbox_available"] = False
        res["sandbox_unavailable"] = str(e)
    return res


def row(loop: dict[str, Any], delay: float, mode: str) -> dict[str, Any]:
    return next(s for s in loop["summary"] if s["delay_ms"] == delay and s["mode"] == mode)


def delays_of(loop: dict[str, Any]) -> list[float]:
    return sorted({s["delay_ms"] for s in loop["summary"]})


TOOLS = {
    "sandbox": '`python("print(1)")` (bubblewrap sandbox)',
    "plain_subprocess": "plain `subprocess.run` (venv interpreter, `-I`)",
    "plain_subprocess_sandbox_interpreter": "plain `subprocess.run` (the sandbox's interpreter, `-I`)",
    "calculator": '`calculator("123456+654321")`',
}
COLUMNS = [
    ("env step", "delay_ms", "{:g} ms"), ("mode", "label", "{}"), ("traj/s", "trajectories_per_s", "{:.1f}"),
    ("engine steps", "engine_steps", "{:g}"), ("wall s", "wall_s", "{:.2f}"), ("env floor s", "env_floor_s", "{:.2f}"),
    ("mean turns", "mean_turns", "{:.2f}"), ("same responses as the other mode", "same", "{:.0%}"),
]  # fmt: skip
TOOL_COLUMNS = [("tool call", "name", "{}"), *((f"{k} ms", k, "{:.3f}") for k in ("median", "min", "max"))]


def markdown(rec: dict[str, Any]) -> str:
    loop, tools = rec["agent_loop"], rec["tools"]
    same = {c["delay_ms"]: c["identical_fraction"] for c in loop["mode_comparison"]}
    rows = [row(loop, d, mo) | {"label": LABELS[mo], "same": same[d]} for d in delays_of(loop) for mo in MODES]
    timed = [{"name": name, **{k: t[f"{k}_s"] * 1e3 for k in ("median", "min", "max")}}
             for key, name in TOOLS.items() if (t := tools.get(key))]  # fmt: skip
    unavailable = "" if tools["sandbox_available"] else f"| sandbox | unavailable: {tools['sandbox_unavailable']} | | |"
    return common.blocks(
        "# Agent-loop benchmark",
        f"{common.versions(rec, [loop['loadavg_1m']])}; in-process vLLM on `{loop['model']}`, {loop['omp_threads']} "
        "engine OpenMP thread(s). Guess-number environment on the demo questions (each env step sleeps between 0 "
        f"and twice the listed mean, seeded per task and turn), {loop['tasks']} tasks x n={loop['n']} = "
        f"{loop['tasks'] * loop['n']} trajectories, max_turns {loop['max_turns']}, {loop['max_tokens_per_turn']} "
        f"tokens per turn, temperature {loop['temperature']}, seed {loop['seed']}, env_workers {loop['env_workers']}. "
        f"Median of {rec['repeats']} repeats after a warm-up, the prefix cache emptied before each run.",
        common.table(rows, COLUMNS),
        "`env floor`: the environment calls alone spread over the env_workers threads (turns x step / threads). "
        "`same responses`: the share of trajectories with equal response tokens in both modes (same seeds).",
        common.table(timed, TOOL_COLUMNS) + unavailable,
        "\n".join(conclusion(rec)),
    )


def conclusion(rec: dict[str, Any]) -> list[str]:
    loop, tools = rec["agent_loop"], rec["tools"]
    parts = []
    for d in delays_of(loop):
        a, b = row(loop, d, "step"), row(loop, d, "turn_batches")
        parts.append(
            f"{a['trajectories_per_s'] / b['trajectories_per_s']:.2f}x with a {d:g} ms environment step "
            f"({a['engine_steps']:g} vs {b['engine_steps']:g} engine steps)"
        )
    out = ["The step loop's trajectories/s against one batch per turn: " + "; ".join(parts) + "."]
    if not tools["sandbox_available"]:
        return [*out, f"The sandbox could not be timed: {tools['sandbox_unavailable']}."]
    return [
        *out,
        f"A sandboxed `python` call costs {tools['sandbox']['median_s'] * 1e3:.1f} ms, "
        f"{tools['sandbox_overhead_s'] * 1e3:+.1f} ms over a plain interpreter start; "
        f"`calculator` {tools['calculator']['median_s'] * 1e6:.0f} us.",
    ]


def plot(path: Path, rec: dict[str, Any]) -> None:
    loop = rec["agent_loop"]
    delays = delays_of(loop)
    fig, (left, right) = common.subplots(1, 2, figsize=(11, 4.2))
    ticks = [f"env step {d:g} ms" for d in delays]
    for ax, key, fmt, ylabel, title in (
        (left, "trajectories_per_s", "{:.1f}", "trajectories / s", "throughput (median)"),
        (right, "engine_steps", "{:g}", "engine steps", "engine steps per run (median)"),
    ):
        series = [(LABELS[mode], [row(loop, d, mode)[key] for d in delays]) for mode in MODES]
        common.bars(ax, ticks, series, fmt, ylabel, title)
    common.save_figure(fig, path, f"agent loop, {loop['tasks']} tasks x n={loop['n']}, {loop['max_turns']} turns x "
                       f"{loop['max_tokens_per_turn']} tokens, env_workers {loop['env_workers']}")  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    tasks, repeats, calls = SETTINGS[common.mode(args)]
    loop = run_loop(tasks, repeats)
    print(f"sandbox: {calls} calls each ...", flush=True)
    return {"repeats": repeats, "quick": args.quick, "tiny": args.tiny, "agent_loop": loop, "tools": bench_tools(calls)}


if __name__ == "__main__":
    common.standalone(sys.modules[__name__])
