"""The agent loop on a real in-process vLLM engine (under torchrun): step-wise turns against one batch per turn.

Per environment delay (a sleep in `step`: a tool call) the same tasks and seed through `AgentLoop(turn_batches=False)`
(a trajectory's next turn starts as soon as its environment answered) and `turn_batches=True` (every turn of a round
finishes first), `env_workers` threads in both. One warm-up of each mode, then the configurations take turns within
each repeat; the prefix cache is emptied before every run.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from benchmarks import common
from torchrl_post.agent.base import Trajectory
from torchrl_post.agent.guess_number import GuessAgent, GuessNumberEnv
from torchrl_post.agent.loop import AgentLoop, LoopLimits
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env, shutdown_distributed
from torchrl_post.engines.base import RolloutEngine, SamplingParams

MODES = {"step": False, "turn_batches": True}
MAX_MODEL_LEN = 256  # the demo model's max_position_embeddings


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


def main() -> None:
    args = common.worker_args(
        __doc__, model=Path, data=Path, tasks=32, samples=2, repeats=3, delays_ms="0,50", max_turns=4, max_tokens=6,
        env_workers=32, temperature=1.0, seed=5,
    )  # fmt: skip
    delays = [float(d) for d in args.delays_ms.split(",") if d.strip()]
    env = read_env("cpu")
    init_world(env)
    cfg = Config()
    cfg.model.path = str(args.model.resolve())
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


if __name__ == "__main__":
    main()
