"""Generation speed of the vLLM engine against the transformers engine, in one process under torchrun.

Both engines as the trainer builds them, the same random prompts, temperature 1, every sample forced to the asked
length (vLLM `ignore_eos` via a subclass, no stop token for transformers; tokens/s from the counted tokens). Per batch
one new token is timed too (prefill and fixed cost: decode = t(L) - t(1) over L - 1 steps), and one prompt of one
token is the fixed cost per call. vLLM's own `LLM.generate` and a stream of the same requests run beside the stepped
driver. Warm-up once per shape; the calls take turns; best of R repeats (the median beside it).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from benchmarks import common
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env, shutdown_distributed
from torchrl_post.engines.base import RolloutEngine, SamplingParams, generate
from torchrl_post.plan import engine_spec
from torchrl_post.rollout.inflight import InflightStream

ENGINES = ("vllm", "hf")


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
    """Each call's best seconds of `repeats` (as timeit: the least disturbed), median seconds and tokens."""
    out = {}
    for k, turns in common.take_turns(calls, repeats).items():
        times = [t[0] for t in turns]
        out[k] = {
            "s": min(times),
            "median_s": statistics.median(times),
            "tokens": statistics.median(t[2] for t in turns),
        }
    return out


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
    """The same samples as a stream's requests (rollout/inflight.py): what partial rollouts and agents drive."""
    one = params(1, max_tokens)

    def call() -> int:
        stream = InflightStream(engine)
        for i, p in enumerate(prompts):
            for j in range(n):
                stream.add(f"{i}.{j}", p, replace(one, sample=j), uid=i)
        return sum(len(s.tokens) for s in stream.run())

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
            row["stepped_vs_llm_generate"] = row["vllm_tokens_per_s"] / row["llm_generate_tokens_per_s"]
            row["stream_tokens_per_s"] = full["stream"]["tokens"] / full["stream"]["s"]
            row["stream_vs_llm_generate"] = row["stream_tokens_per_s"] / row["llm_generate_tokens_per_s"]
            rows.append(row)
            print(f"  {prompts_count}x{n} len {length}: ratio {row['ratio']:.2f}", flush=True)
    return {"fixed_call_s": {e: fixed[e]["s"] for e in ENGINES}, "rows": rows}


def main() -> None:
    args = common.worker_args(
        __doc__, model=Path, prompt_len=16, batches="1x1,4x4", lengths="32,128", repeats=3, kv_cache_gb=1
    )
    args.batch_list = [tuple(int(x) for x in b.lower().split("x")) for b in args.batches.split(",")]
    args.length_list = [int(x) for x in args.lengths.split(",")]
    env = read_env("auto")
    init_world(env)
    cfg = Config()
    cfg.model.path = str(args.model.resolve())
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


if __name__ == "__main__":
    main()
