"""Agent-loop benchmark: step-wise turns against one batch per turn (`worker`, in-process vLLM on the demo model,
guess-number environment), and the built-in tools' cost per call (SETTINGS: tasks, repeats, calls per mode).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from benchmarks import common
from benchmarks.common import DEMO_DATA, demo_model
from torchrl_post.agent.base import Trajectory
from torchrl_post.agent.guess_number import GuessAgent, GuessNumberEnv
from torchrl_post.agent.loop import AgentLoop, LoopLimits
from torchrl_post.distributed.env import end_process, shutdown_distributed
from torchrl_post.engines.base import RolloutEngine, SamplingParams

NAME = "agent_loop"
MODES = {"step": False, "turn_batches": True}  # mode -> AgentLoop(turn_batches=...)
MAX_MODEL_LEN = 256  # the demo model's max_position_embeddings
LABELS = {"step": "step loop", "turn_batches": "one batch per turn"}
SETTINGS = {"full": (32, 3, 20), "quick": (8, 3, 10), "tiny": (2, 1, 2)}  # tasks, repeats, timed calls per tool
N, DELAYS_MS, ENV_WORKERS, OMP_THREADS = 2, "0,50", 32, 1  # trajectories per task, env step delays, threads
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


class SlowGuessEnv(GuessNumberEnv):
    """GuessNumberEnv whose step sleeps between 0 and 2 x `delay_s`, seeded by task and turn (alike in every run)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls = 0

    def reset(self, task: dict[str, Any]) -> str:
        self.key = str(task.get("question", "")) + str(task["answer"])
        return super().reset(task)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.calls += 1
        if self.delay_s > 0:
            time.sleep(2 * random.Random(f"{self.key}/{self.calls}").random() * self.delay_s)
        return super().step(action)


def one_run(
    engine: RolloutEngine, tok: Any, args: Any, tasks: list[Any], delay_ms: float, turn_batches: bool
) -> tuple[dict[str, Any], list[Trajectory]]:
    limits = LoopLimits(
        max_turns=args.max_turns, max_response_length=args.max_turns * args.max_tokens, max_model_len=MAX_MODEL_LEN,
        timeout_s=600.0, max_tokens_per_turn=args.max_tokens,
    )  # fmt: skip
    params = SamplingParams(
        n=args.samples, temperature=args.temperature, top_p=1.0, top_k=-1, max_tokens=args.max_tokens, seed=args.seed
    )
    make_env = partial(SlowGuessEnv, delay_ms / 1e3)
    loop = AgentLoop(
        engine, tok, make_env, GuessAgent(), limits, env_workers=args.env_workers, turn_batches=turn_batches
    )
    if (llm := getattr(engine, "llm", None)) is not None:
        llm.reset_prefix_cache()
    t0 = time.perf_counter()
    trajs = loop.run(tasks, params)
    wall = time.perf_counter() - t0
    stats = {
        "wall_s": wall, "trajectories": len(trajs), "trajectories_per_s": len(trajs) / wall,
        "engine_steps": loop.engine_steps, "mean_turns": statistics.fmean(len(t.steps) for t in trajs),
        "turns": sum(len(t.steps) for t in trajs),
        "response_tokens": sum(len(s.response_ids) for t in trajs for s in t.steps), "env_seconds": loop.env_seconds,
        "env_workers": args.env_workers, "mean_reward": statistics.fmean(t.reward for t in trajs),
        "terminations": dict(Counter(t.termination for t in trajs)),
    }  # fmt: skip
    return stats, trajs


def summarize(runs: list[dict[str, Any]], delay_ms: float, mode: str) -> dict[str, Any]:
    rs = [r for r in runs if r["delay_ms"] == delay_ms and r["mode"] == mode]
    keys = ("wall_s", "engine_steps", "mean_turns", "turns", "env_seconds")
    med = {k: statistics.median(r[k] for r in rs) for k in keys}
    return {
        "delay_ms": delay_ms, "mode": mode, "repeats": len(rs), **med, "trajectories": rs[0]["trajectories"],
        "trajectories_per_s": rs[0]["trajectories"] / med["wall_s"],
        # The environment calls alone, spread over every worker thread: no schedule finishes sooner.
        "env_floor_s": med["turns"] * delay_ms / 1e3 / rs[0]["env_workers"],
        "wall_s_all": [r["wall_s"] for r in rs], "engine_steps_all": [r["engine_steps"] for r in rs],
    }  # fmt: skip


def worker(argv: list[str]) -> None:
    """Both loop modes per environment delay on one in-process vLLM engine, taking turns (under torchrun)."""
    args = common.worker_args(
        worker.__doc__, argv, model=Path, data=Path, tasks=32, samples=2, repeats=3, delays_ms="0,50", max_turns=4,
        max_tokens=6, env_workers=32, temperature=1.0, seed=5,
    )  # fmt: skip
    delays = [float(d) for d in args.delays_ms.split(",") if d.strip()]
    env, cfg = common.worker_init("cpu", args.model)
    cfg.data.max_response_length = args.max_turns * args.max_tokens
    cfg.data.max_prompt_length = MAX_MODEL_LEN - cfg.data.max_response_length
    cfg.rollout.max_num_seqs = max(8, args.tasks * args.samples)
    # As an agent run configures the engine (prefix caching across turns).
    cfg.agent.env = f"{GuessNumberEnv.__module__}:{GuessNumberEnv.__name__}"
    cfg.agent.agent = f"{GuessAgent.__module__}:{GuessAgent.__name__}"
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    t0 = time.perf_counter()
    engine = common.build_engine(cfg, env.device, tok=tok)
    engine_start_s = time.perf_counter() - t0
    # The guess-number task on the demo data's questions (sums; hints "higher"/"lower" after a wrong answer).
    rows = [json.loads(line) for line in args.data.read_text().splitlines()][: args.tasks]
    tasks = [(i, {"answer": r["answer"], "question": r["prompt"]}) for i, r in enumerate(rows)]
    try:
        warmup = {mode: one_run(engine, tok, args, tasks, 0.0, tb)[0]["wall_s"] for mode, tb in MODES.items()}
        runs: list[dict[str, Any]] = []
        outputs: dict[tuple[float, str], list[Any]] = {}
        for rep in range(args.repeats):
            for delay in delays:
                for mode, tb in MODES.items():
                    stats, trajs = one_run(engine, tok, args, tasks, delay, tb)
                    runs.append({"delay_ms": delay, "mode": mode, "repeat": rep, **stats})
                    outputs.setdefault((delay, mode), []).append(
                        [[list(s.response_ids) for s in t.steps] for t in trajs]
                    )
                    print(f"repeat {rep} delay {delay:g} ms {mode}: {stats['wall_s']:.2f} s", flush=True)
        summary = [summarize(runs, d, m) for d in delays for m in MODES]
        for s in summary:
            outs = outputs[(s["delay_ms"], s["mode"])]
            s["reproducible_across_repeats"] = all(o == outs[0] for o in outs)
        comparisons = []
        for d in delays:
            a, b = outputs[(d, "step")][0], outputs[(d, "turn_batches")][0]
            frac = sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
            comparisons.append({"delay_ms": d, "identical": frac == 1.0, "identical_fraction": frac})
        common.write_json(args.out, {
            "model": args.model.name, "tasks": args.tasks, "n": args.samples, "max_turns": args.max_turns,
            "max_tokens_per_turn": args.max_tokens, "temperature": args.temperature, "seed": args.seed,
            "env_workers": args.env_workers, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": cfg.rollout.max_num_seqs,
            "engine_start_s": engine_start_s, "warmup_s": warmup, "runs": runs, "summary": summary,
            "mode_comparison": comparisons,
        })  # fmt: skip
    finally:
        engine.shutdown()
        shutdown_distributed()
    end_process()


def bench_tools(calls: int) -> dict[str, Any]:
    from torchrl_post.tools.builtin import calculator, python
    from torchrl_post.tools.sandbox import SandboxLimits, SandboxUnavailable

    def median_s(fn: Callable[[], Any]) -> dict[str, float]:
        times = [t[0] for t in common.take_turns({"fn": fn}, calls)["fn"]]
        return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}

    interp, code = SandboxLimits().interpreter, "print(1)"
    res: dict[str, Any] = {"calls": calls, "code": code, "sandbox_interpreter": interp}
    plain = {"plain_subprocess": sys.executable, "plain_subprocess_sandbox_interpreter": interp}
    for key, exe in plain.items():
        if Path(exe).exists():  # the sandbox's interpreter may be missing
            res[key] = median_s(partial(subprocess.run, [exe, "-I", "-c", code], capture_output=True, check=True))
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


def markdown(rec: dict[str, Any]) -> str:
    loop, tools = rec["agent_loop"], rec["tools"]
    same = {c["delay_ms"]: c["identical_fraction"] for c in loop["mode_comparison"]}
    rows = [row(loop, d, mo) | {"label": LABELS[mo], "same": same[d]} for d in delays_of(loop) for mo in MODES]
    timed = [{"name": name, **{k: t[f"{k}_s"] * 1e3 for k in ("median", "min", "max")}}
             for key, name in TOOLS.items() if (t := tools.get(key))]  # fmt: skip
    unavailable = "" if tools["sandbox_available"] else f"| sandbox | unavailable: {tools['sandbox_unavailable']} | | |"
    speedups = []
    for d in delays_of(loop):
        a, b = row(loop, d, "step"), row(loop, d, "turn_batches")
        speedups.append(
            f"{a['trajectories_per_s'] / b['trajectories_per_s']:.2f}x with a {d:g} ms environment step "
            f"({a['engine_steps']:g} vs {b['engine_steps']:g} engine steps)"
        )
    sandbox = (
        f"A sandboxed `python` call costs {tools['sandbox']['median_s'] * 1e3:.1f} ms, "
        f"{tools['sandbox_overhead_s'] * 1e3:+.1f} ms over a plain interpreter start; "
        f"`calculator` {tools['calculator']['median_s'] * 1e6:.0f} us."
        if tools["sandbox_available"]
        else f"The sandbox could not be timed: {tools['sandbox_unavailable']}."
    )
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
        f"The step loop's trajectories/s against one batch per turn: {'; '.join(speedups)}.\n{sandbox}",
    )


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
    options = {
        "model": demo_model(), "data": DEMO_DATA / "train.jsonl", "tasks": tasks, "samples": N, "repeats": repeats,
        "delays_ms": DELAYS_MS, "env_workers": ENV_WORKERS,
    }  # fmt: skip
    # The engine's OpenMP threads unbound: on shared cores vLLM's pinned thread per core stalls 10x at times.
    env = {"OMP_NUM_THREADS": str(OMP_THREADS), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    print(f"agent loop: {tasks} tasks x n={N}, {repeats} repeats ...", flush=True)
    loop = common.run_worker("agent_loop", "benchmarks.agent_loop", 1, options, env, wall_key="worker_s")
    loop["omp_threads"] = OMP_THREADS
    print(f"sandbox: {calls} calls each ...", flush=True)
    return {"repeats": repeats, "quick": args.quick, "tiny": args.tiny, "agent_loop": loop, "tools": bench_tools(calls)}


if __name__ == "__main__":
    common.standalone()
