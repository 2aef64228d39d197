"""Rollout benchmark: generation tokens/s of the vLLM engine against the transformers engine (`worker`, SETTINGS).

On CPU both engines run `--threads` unbound OpenMP threads (on shared cores pinned threads stall whenever another
process takes one of their cores).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from benchmarks import common
from benchmarks.common import SIZES, model_dir
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, shutdown_distributed
from torchrl_post.engines.base import RolloutEngine, SamplingParams, generate
from torchrl_post.plan import engine_spec
from torchrl_post.rollout.episodes import Episodes, OneTurn
from torchrl_post.rollout.inflight import InflightStream

NAME = "rollout"
SETTINGS = {  # mode -> models, batches, lengths, repeats, prompt length
    "full": (("qwen2-10m", "qwen2-40m"), "1x1,4x4,16x4,32x8", "32,128,224", 3, 16),
    "quick": (("qwen2-10m",), "1x1,4x2,8x8", "8,128", 15, 16),  # 8x8: the demo's per-engine batch
    "tiny": (("qwen2-1m",), "1x1,2x2", "4,8", 1, 8),
}
ENGINES = ("vllm", "hf")
COLUMNS = [
    ("prompts x n", "shape", "{}"), ("length", "length", "{}"), ("vllm tok/s", "vllm_tokens_per_s", "{:.0f}"),
    ("hf tok/s", "hf_tokens_per_s", "{:.0f}"), ("ratio", "ratio", "{:.2f}"),
    ("LLM.generate tok/s", "llm_generate_tokens_per_s", "{:.0f}"),
    ("stepped / LLM.generate", "stepped_vs_llm_generate", "{:.3f}"),
    ("streamed / LLM.generate", "stream_vs_llm_generate", "{:.3f}"), ("vllm s", "vllm_s", "{:.3f}"),
    ("vllm first token s", "vllm_first_token_s", "{:.3f}"), ("vllm decode ms/step", "vllm_decode_step_ms", "{:.2f}"),
    ("vllm decode share", "vllm_decode_share", "{:.0%}"), ("hf s", "hf_s", "{:.3f}"),
    ("hf first token s", "hf_first_token_s", "{:.3f}"), ("hf decode ms/step", "hf_decode_step_ms", "{:.2f}"),
]  # fmt: skip
OPTIONS: common.Options = {
    "--repeats": {"type": int},
    "--threads": {"type": int, "default": 1, "help": "CPU: OpenMP/torch threads of both engines, unbound"},
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode(args)
    models, batches, lengths, repeats, prompt_len = SETTINGS[mode]
    repeats = args.repeats or repeats
    env = {"TOKENIZERS_PARALLELISM": "false"}
    if not torch.cuda.is_available():  # the engines compute on the CPU: `threads` each, unbound
        env |= {"OMP_NUM_THREADS": str(args.threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    runs = []
    for model in models:
        print(f"  {model}: batches {batches}, lengths {lengths}, {repeats} repeats ...", flush=True)
        size = SIZES[model]
        max_seqs = max(int(p) * int(n) for p, n in (b.split("x") for b in batches.split(",")))
        max_len = prompt_len + max(int(x) for x in lengths.split(","))
        head_dim = size.hidden_size // size.num_heads
        kv_gb = max(1, -(-2 * size.num_layers * size.num_kv_heads * head_dim * 4 * max_seqs * max_len * 2 // 2**30))
        worker_args = {
            "model": model_dir(size), "prompt_len": prompt_len, "batches": batches, "lengths": lengths,
            "repeats": repeats, "kv_cache_gb": kv_gb,
        }  # fmt: skip
        rec = common.run_worker(f"rollout_{model}", "benchmarks.rollout", 1, worker_args, env)
        rec["decode_fit"] = {e: decode_fit(rec, e) for e in ENGINES}
        runs.append(rec)
    return {"mode": mode, "repeats": repeats, "threads": args.threads, "runs": runs, "loadavg_1m": common.load_1m()}


def decode_fit(run: dict[str, Any], engine: str) -> dict[str, float] | None:
    """Decode step time = `step_ms` (whatever the batch) + `sample_ms` x batch, fitted on the longest rows."""
    longest = max(r["length"] for r in run["rows"])
    pts = [(r["batch"], r[f"{engine}_decode_step_ms"]) for r in run["rows"] if r["length"] == longest]
    if longest < 2 or len({b for b, _ in pts}) < 2:
        return None
    f = common.fit(pts)
    assert f is not None
    return {"step_ms": f["intercept_bytes"], "sample_ms": f["slope_bytes_per_token"], "length": longest}


def fixed_length_vllm(cfg: Config, device: torch.device) -> RolloutEngine:
    """The project's vLLM engine with `ignore_eos` on every request: each sample runs to max_tokens."""
    from torchrl_post.engines.vllm import VLLMEngine

    class FixedLengthVLLM(VLLMEngine):
        def _sampling(self, params: SamplingParams, uid: int, n: int) -> Any:
            sampling = super()._sampling(params, uid, n)
            sampling.ignore_eos = True
            return sampling

    return FixedLengthVLLM(cfg.model, cfg.rollout, engine_spec(cfg, device=device.type), device, seed=0)


def timed_turns(calls: dict[str, Callable[[], int]], repeats: int) -> dict[str, dict[str, float]]:
    """Each call's best and median seconds of `repeats` taking turns, its tokens, and tokens/s per round."""
    out = {}
    for k, turns in common.take_turns(calls, repeats).items():
        times = [t[0] for t in turns]
        out[k] = {"s": min(times), "median_s": statistics.median(times),
                  "tokens": statistics.median(t[2] for t in turns), "rounds": [t[2] / t[0] for t in turns]}  # fmt: skip
    return out


def paired(a: dict[str, Any], b: dict[str, Any]) -> float:
    """a's tokens/s over b's: the median of the rounds' ratios, robust to a load that changes between rounds."""
    return statistics.median(x / y for x, y in zip(a["rounds"], b["rounds"], strict=True))


def params(n: int, max_tokens: int) -> SamplingParams:
    return SamplingParams(n=n, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, seed=1)


def generate_call(engine: RolloutEngine, prompts: list[list[int]], n: int, max_tokens: int) -> Callable[[], int]:
    sampling, uids = params(n, max_tokens), list(range(len(prompts)))
    return lambda: sum(len(r) for r in generate(engine, prompts, uids, sampling).response_ids)


def llm_generate_call(engine: Any, prompts: list[list[int]], n: int, max_tokens: int) -> Callable[[], int]:
    """vLLM's own `LLM.generate` on the same engine and sampling: what the stepped driver must keep up with."""
    inputs: Any = [{"prompt_token_ids": p} for p in prompts]
    each = params(n, max_tokens)

    def call() -> int:
        sampling = [engine._sampling(each, uid, n) for uid in range(len(prompts))]
        outs = engine.llm.generate(inputs, sampling, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    return call


def stream_call(engine: RolloutEngine, prompts: list[list[int]], n: int, max_tokens: int) -> Callable[[], int]:
    """The same samples as one-turn episodes streamed as partial rollouts run them (rollout/episodes.py)."""
    one = params(1, max_tokens)

    def call() -> int:
        episodes = Episodes(OneTurn(progress=True), InflightStream(engine))
        episodes.start([(f"{i}.{j}", i, {"prompt_ids": p}, j) for i, p in enumerate(prompts) for j in range(n)], one)
        done = []
        while episodes.running:
            done += episodes.advance()
        return sum(len(t.steps[0].response_ids) for _, t in done)

    return call


def measure(args: Any, engines: dict[str, RolloutEngine], vocab: int) -> dict[str, Any]:
    def make_prompts(count: int, seed: int) -> list[list[int]]:
        rng = random.Random(seed)
        return [[rng.randrange(5, vocab) for _ in range(args.prompt_len)] for _ in range(count)]

    # The fixed cost per call: one prompt, one sample, one token.
    fixed = timed_turns({e: generate_call(engines[e], make_prompts(1, 0), 1, 1) for e in ENGINES}, args.repeats)
    rows = []
    for prompts_count, n in args.batch_list:
        prompts = make_prompts(prompts_count, seed=prompts_count)
        first = timed_turns({e: generate_call(engines[e], prompts, n, 1) for e in ENGINES}, args.repeats)
        for length in args.length_list:
            calls = {e: generate_call(engines[e], prompts, n, length) for e in ENGINES}
            calls["llm_generate"] = llm_generate_call(engines["vllm"], prompts, n, length)
            calls["stream"] = stream_call(engines["vllm"], prompts, n, length)
            full = timed_turns(calls, args.repeats)
            row: dict[str, Any] = {"prompts": prompts_count, "n": n, "batch": prompts_count * n, "length": length}
            for e in ENGINES:
                t, t1 = full[e]["s"], first[e]["s"]
                row |= {
                    f"{e}_s": t, f"{e}_median_s": full[e]["median_s"], f"{e}_tokens": full[e]["tokens"],
                    f"{e}_tokens_per_s": full[e]["tokens"] / t,
                    f"{e}_first_token_s": t1,  # prefill + the call's fixed cost
                    f"{e}_decode_step_ms": max(t - t1, 0.0) / max(length - 1, 1) * 1e3,
                    f"{e}_decode_share": max(t - t1, 0.0) / t,
                }  # fmt: skip
            row["ratio"] = row["vllm_tokens_per_s"] / row["hf_tokens_per_s"]
            row["llm_generate_tokens_per_s"] = full["llm_generate"]["tokens"] / full["llm_generate"]["s"]
            row["stepped_vs_llm_generate"] = paired(full["vllm"], full["llm_generate"])
            row["stream_tokens_per_s"] = full["stream"]["tokens"] / full["stream"]["s"]
            row["stream_vs_llm_generate"] = paired(full["stream"], full["llm_generate"])
            rows.append(row)
            print(f"  {prompts_count}x{n} len {length}: ratio {row['ratio']:.2f}", flush=True)
    return {"fixed_call_s": {e: fixed[e]["s"] for e in ENGINES}, "rows": rows}


def worker(argv: list[str]) -> None:
    """Both engines as the trainer builds them, every sample forced to the asked length, taking turns."""
    args = common.worker_args(
        worker.__doc__, argv, model=Path, prompt_len=16, batches="1x1,4x4", lengths="32,128", repeats=3, kv_cache_gb=1
    )
    args.batch_list = [tuple(int(x) for x in b.lower().split("x")) for b in args.batches.split(",")]
    args.length_list = [int(x) for x in args.lengths.split(",")]
    env, cfg = common.worker_init("auto", args.model)
    cfg.data.max_prompt_length = args.prompt_len
    cfg.data.max_response_length = max(args.length_list)
    cfg.rollout.max_num_seqs = max(p * n for p, n in args.batch_list)  # every call is one engine batch
    cfg.rollout.cpu_kvcache_space_gb = args.kv_cache_gb
    cfg.rollout.dtype = "bfloat16" if env.device.type == "cuda" else "float32"
    cfg.rollout.load_format = "auto"  # both engines read the model's weights (no sync comes to replace them)
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    engines: dict[str, RolloutEngine] = {}
    start_s: dict[str, float] = {}
    for name in ENGINES:
        t0 = time.perf_counter()
        cfg.rollout.engine = name
        build = fixed_length_vllm if name == "vllm" else partial(common.build_engine, stop=False, tok=tok)
        engines[name] = build(cfg, env.device)
        start_s[name] = time.perf_counter() - t0
    try:
        result = measure(args, engines, len(tok))
        mcfg = AutoConfig.from_pretrained(cfg.model.path)
        hf: Any = engines["hf"]
        common.write_json(args.out, {
            "model": args.model.name, "hidden_size": mcfg.hidden_size, "num_layers": mcfg.num_hidden_layers,
            "params": sum(p.numel() for p in hf.model.parameters()), "dtype": cfg.rollout.dtype,
            "device": env.device.type, "prompt_len": args.prompt_len, "repeats": args.repeats, "temperature": 1.0,
            "torch_threads": torch.get_num_threads(), "engine_start_s": start_s, **result,
        })  # fmt: skip
    finally:
        for engine in engines.values():
            engine.shutdown()
        shutdown_distributed()
    end_process()


def markdown(rec: dict[str, Any]) -> str:
    parts = [
        "# Rollout benchmark: vLLM against transformers generate",
        f"{common.versions(rec)}; 1-minute load average {rec['loadavg_1m']:.1f} at the end. Both engines in one "
        f"process, temperature 1, every sample forced to `length` tokens, {rec.get('threads', 1)} CPU thread(s) "
        f"each; best of {rec['repeats']} repeats, taking turns. `ratio` = vLLM / hf tokens/s; `... / LLM.generate`: "
        "the median of the rounds' ratios (records before 2026-11-30: of the best rounds); `first token s`: a "
        "call of one new token; `decode ms/step` = (t(length) - t(1)) / (length - 1); `decode share`: the call's "
        "time after the first token.",
    ]
    for r in rec["runs"]:
        start, fixed = r["engine_start_s"], r["fixed_call_s"]
        ratios = [row["ratio"] for row in r["rows"]]
        big = max(r["rows"], key=lambda row: (row["batch"], row["length"]))
        text = (
            f"vLLM/hf tokens/s: {min(ratios):.2f}x to {max(ratios):.2f}x ({big['prompts']} x {big['n']} x "
            f"{big['length']} tokens: {big['ratio']:.2f}x, where vLLM takes {big['vllm_first_token_s']:.3f} s to the "
            f"first token, then {big['vllm_decode_step_ms']:.2f} ms per decode step of {big['batch']} samples, "
            f"{big['vllm_decode_share']:.0%} of the call)."
        )
        v, h = decode_fit(r, "vllm"), decode_fit(r, "hf")
        if v is not None and h is not None:
            text += (
                f" A decode step (fit on the {v['length']}-token rows): {v['step_ms']:.2f} ms + {v['sample_ms']:.3f} "
                f"ms per sample in vLLM, {h['step_ms']:.2f} ms + {h['sample_ms']:.3f} ms in transformers"
            )
            text += (
                f"; in vLLM the samples outweigh the step from {v['step_ms'] / v['sample_ms']:.0f} per call."
                if v["sample_ms"] > 0
                else "."
            )
        parts += [
            f"## {r['model']} ({r['params'] / 1e6:.1f}M parameters, {r['dtype']}, {r['device']}, prompts of "
            f"{r['prompt_len']} tokens)",
            common.table([{**row, "shape": f"{row['prompts']} x {row['n']}"} for row in r["rows"]], COLUMNS),
            f"Engine start: vLLM {start['vllm']:.1f} s, hf {start['hf']:.1f} s; a call of 1 prompt and 1 token: vLLM "
            f"{fixed['vllm'] * 1e3:.1f} ms, hf {fixed['hf'] * 1e3:.1f} ms. Load average {r['loadavg_1m']:.1f}. " + text,
        ]
    return common.blocks(*parts)


def plot(path: Path, rec: dict[str, Any]) -> None:
    runs = rec["runs"]
    fig, axes = common.subplots(1, len(runs), figsize=(max(7.0, 6 * len(runs)), 4.5), squeeze=False)
    for ax, r in zip(axes[0], runs, strict=True):
        curves: list[common.Curve] = []
        for i, length in enumerate(sorted({row["length"] for row in r["rows"]})):
            rows = sorted((row for row in r["rows"] if row["length"] == length), key=lambda row: row["batch"])
            xs = [row["batch"] for row in rows]
            curves.append((f"vLLM, {length} tok", xs, [row["vllm_tokens_per_s"] for row in rows], f"C{i}o-"))
            curves.append((f"hf, {length} tok", xs, [row["hf_tokens_per_s"] for row in rows], f"C{i}s--"))
        ax.set(xscale="log", yscale="log", xlabel="samples per call (prompts x n)", ylabel="generated tokens / s")
        title = f"{r['model']} ({r['params'] / 1e6:.1f}M params, {r['device']})"
        common.lines(ax, curves, title, sorted({row["batch"] for row in r["rows"]}))
    common.save_figure(fig, path, "rollout: vLLM (solid) vs transformers generate (dashed)")


if __name__ == "__main__":
    common.standalone()
