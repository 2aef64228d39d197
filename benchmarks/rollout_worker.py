"""Generation speed of the vLLM engine against the transformers engine, in one process under torchrun.

    torchrun --standalone --nproc-per-node 1 benchmarks/rollout_worker.py \
        --model DIR --prompt-len P --batches 1x1,4x4 --lengths 32,128 --repeats R --out FILE

Both engines are the project's own (`torchrl_post.rollout.build_engine`, as the trainer builds them), on the same
random prompts (P tokens each, `prompts x n` samples per call) with temperature 1. Every sample is forced to the
asked length: vLLM's sampling parameters get `ignore_eos` (the engine's adapter does not expose it, so a
subclass here sets it) and the transformers engine gets no stop token; the generated tokens are counted anyway
and tokens/s comes from those counts.

Per batch it also times one new token (prefill and the per-call fixed cost, no decode), so a row's time splits
into that and the decode steps: decode = t(L) - t(1) over L - 1 steps. One call of a single prompt and a single
token is the engine's fixed cost per call. Each shape is warmed up once; the engines take turns within every
repeat (outside load on the CPUs hits both alike); the best of R repeats is reported (as timeit: the least
disturbed by other processes), the median beside it.

The benchmark's deliberate simplifications: one prompt length, prompts of random tokens, no weight sync between
calls, one process (no tensor parallelism).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env, shutdown_distributed
from torchrl_post.engines.base import RolloutEngine, SamplingParams, generate
from torchrl_post.engines.build import build_engine
from torchrl_post.engines.hf import HFEngine
from torchrl_post.plan import engine_spec
from torchrl_post.rollout.inflight import InflightStream

ENGINES = ("vllm", "hf")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--batches", default="1x1,4x4", help="prompts x n per call, comma-separated")
    ap.add_argument("--lengths", default="32,128", help="response lengths (tokens per sample), comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-cache-gb", type=int, default=1, help="vLLM's CPU KV cache")
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def parse_batches(text: str) -> list[tuple[int, int]]:
    """`1x1,4x4` -> [(1, 1), (4, 4)]: (prompts, n) per call."""
    out = []
    for item in text.split(","):
        prompts, n = item.lower().split("x")
        out.append((int(prompts), int(n)))
    return out


def build_config(args: argparse.Namespace, device: torch.device, lengths: list[int], max_seqs: int) -> Config:
    cfg = Config()
    cfg.model.path = str(args.model.resolve())
    cfg.data.max_prompt_length = args.prompt_len
    cfg.data.max_response_length = max(lengths)
    cfg.rollout.max_num_seqs = max_seqs  # every call is one engine batch
    cfg.rollout.cpu_kvcache_space_gb = args.kv_cache_gb
    cfg.rollout.dtype = "bfloat16" if device.type == "cuda" else "float32"
    cfg.rollout.load_format = "auto"  # both engines read the model's weights (no sync comes to replace them)
    return cfg


def fixed_length_vllm(cfg: Config, device: torch.device) -> RolloutEngine:
    """The project's vLLM engine with `ignore_eos` on every request: each sample runs to max_tokens."""
    from torchrl_post.engines.vllm import VLLMEngine

    class FixedLengthVLLM(VLLMEngine):
        def _sampling(self, params: SamplingParams, uid: int, n: int) -> Any:
            sampling = super()._sampling(params, uid, n)
            sampling.ignore_eos = True
            return sampling

    return FixedLengthVLLM(cfg.model, cfg.rollout, engine_spec(cfg, device=device.type), device, seed=0)


def build_engines(cfg: Config, device: torch.device, pad_id: int) -> tuple[dict[str, RolloutEngine], dict[str, float]]:
    """Both engines (the hf one with no stop token) and the seconds each took to start."""
    engines: dict[str, RolloutEngine] = {}
    start_s: dict[str, float] = {}
    for name in ENGINES:
        t0 = time.perf_counter()
        cfg.rollout.engine = name
        if name == "vllm":
            engines[name] = fixed_length_vllm(cfg, device)
        else:
            engines[name] = build_engine(
                cfg.model, cfg.rollout, engine_spec(cfg, device=device.type), device, 0, pad_id, []
            )
            assert isinstance(engines[name], HFEngine)
        start_s[name] = time.perf_counter() - t0
    return engines, start_s


def make_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(length)] for _ in range(count)]


def timed_turns(calls: dict[str, Callable[[], int]], repeats: int) -> dict[str, dict[str, float]]:
    """Seconds of each call, best of `repeats` (as timeit: the least disturbed by other processes) and median,
    and the tokens it generated, after one warm-up each; the calls take turns."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {k: [] for k in calls}
    tokens: dict[str, list[int]] = {k: [] for k in calls}
    for _ in range(repeats):
        for key, call in calls.items():
            t0 = time.perf_counter()
            tokens[key].append(call())
            times[key].append(time.perf_counter() - t0)
    return {
        k: {"s": min(times[k]), "median_s": statistics.median(times[k]), "tokens": statistics.median(tokens[k])}
        for k in calls
    }


def generate_call(engine: RolloutEngine, prompts: list[list[int]], n: int, max_tokens: int) -> Callable[[], int]:
    params = SamplingParams(n=n, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, seed=1)
    uids = list(range(len(prompts)))

    def call() -> int:
        gen = generate(engine, prompts, uids, params)
        return sum(len(r) for r in gen.response_ids)

    return call


def llm_generate_call(engine: Any, prompts: list[list[int]], n: int, max_tokens: int) -> Callable[[], int]:
    """vLLM's own batch call (`LLM.generate`) on the same engine, with the sampling parameters the stepped driver
    gives each request: the reference the stepped protocol (`rollout.base.generate`) must keep up with."""
    params = SamplingParams(n=n, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, seed=1)
    inputs: Any = [{"prompt_token_ids": p} for p in prompts]

    def call() -> int:
        sampling = [engine._sampling(params, uid, n) for uid in range(len(prompts))]
        outs = engine.llm.generate(inputs, sampling, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    return call


def stream_call(engine: RolloutEngine, prompts: list[list[int]], n: int, max_tokens: int) -> Callable[[], int]:
    """The same samples as requests of a stream (rollout/inflight.py), each step reporting its new tokens: what
    partial rollouts and agents drive."""
    params = SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, seed=1)

    def call() -> int:
        stream = InflightStream(engine)
        for i, p in enumerate(prompts):
            for j in range(n):
                stream.add(f"{i}.{j}", p, replace(params, sample=j), uid=i)
        return sum(len(s.tokens) for s in stream.run())

    return call


def measure(args: argparse.Namespace, engines: dict[str, RolloutEngine], vocab: int) -> dict[str, Any]:
    batches, lengths = parse_batches(args.batches), [int(x) for x in args.lengths.split(",")]
    one = make_prompts(1, args.prompt_len, vocab, seed=0)
    # The fixed cost per call: one prompt, one sample, one token.
    fixed = timed_turns({e: generate_call(engines[e], one, 1, 1) for e in ENGINES}, args.repeats)
    rows = []
    for prompts_count, n in batches:
        prompts = make_prompts(prompts_count, args.prompt_len, vocab, seed=prompts_count)
        first = timed_turns({e: generate_call(engines[e], prompts, n, 1) for e in ENGINES}, args.repeats)
        for length in lengths:
            calls = {e: generate_call(engines[e], prompts, n, length) for e in ENGINES}
            calls["llm_generate"] = llm_generate_call(engines["vllm"], prompts, n, length)
            calls["stream"] = stream_call(engines["vllm"], prompts, n, length)
            full = timed_turns(calls, args.repeats)
            row: dict[str, Any] = {"prompts": prompts_count, "n": n, "batch": prompts_count * n, "length": length}
            for e in ENGINES:
                t, t1 = full[e]["s"], first[e]["s"]
                row |= {
                    f"{e}_s": t,
                    f"{e}_median_s": full[e]["median_s"],
                    f"{e}_tokens": full[e]["tokens"],
                    f"{e}_tokens_per_s": full[e]["tokens"] / t,
                    f"{e}_first_token_s": t1,  # prefill + the call's fixed cost
                    f"{e}_decode_step_ms": max(t - t1, 0.0) / max(length - 1, 1) * 1e3,
                    f"{e}_decode_share": max(t - t1, 0.0) / t,
                }
            row["ratio"] = row["vllm_tokens_per_s"] / row["hf_tokens_per_s"]
            row["llm_generate_tokens_per_s"] = full["llm_generate"]["tokens"] / full["llm_generate"]["s"]
            row["stepped_vs_llm_generate"] = row["vllm_tokens_per_s"] / row["llm_generate_tokens_per_s"]
            row["stream_tokens_per_s"] = full["stream"]["tokens"] / full["stream"]["s"]
            row["stream_vs_llm_generate"] = row["stream_tokens_per_s"] / row["llm_generate_tokens_per_s"]
            rows.append(row)
            print(
                f"  {prompts_count}x{n} len {length}: vllm {row['vllm_tokens_per_s']:.0f} tok/s, "
                f"hf {row['hf_tokens_per_s']:.0f} tok/s, ratio {row['ratio']:.2f}; LLM.generate "
                f"{row['llm_generate_tokens_per_s']:.0f} tok/s, stepped/LLM.generate {row['stepped_vs_llm_generate']:.3f}, "
                f"streamed/LLM.generate {row['stream_vs_llm_generate']:.3f}",
                flush=True,
            )
    return {"fixed_call_s": {e: fixed[e]["s"] for e in ENGINES}, "rows": rows}


def main() -> None:
    args = parse_args()
    env = read_env("auto")
    init_world(env)
    batches, lengths = parse_batches(args.batches), [int(x) for x in args.lengths.split(",")]
    cfg = build_config(args, env.device, lengths, max(p * n for p, n in batches))
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    engines, start_s = build_engines(cfg, env.device, tok.pad_token_id)
    try:
        result = measure(args, engines, len(tok))
        from transformers import AutoConfig

        mcfg = AutoConfig.from_pretrained(cfg.model.path)
        rec = {
            "model": args.model.name,
            "hidden_size": mcfg.hidden_size,
            "num_layers": mcfg.num_hidden_layers,
            "params": sum(p.numel() for p in engines["hf"].model.parameters()),  # type: ignore[attr-defined]
            "dtype": cfg.rollout.dtype,
            "device": env.device.type,
            "prompt_len": args.prompt_len,
            "repeats": args.repeats,
            "temperature": 1.0,
            "torch_threads": torch.get_num_threads(),
            "engine_start_s": start_s,
            **result,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rec, indent=1) + "\n")
    finally:
        for engine in engines.values():
            engine.shutdown()
        shutdown_distributed()
    end_process()


if __name__ == "__main__":
    main()
