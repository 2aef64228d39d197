"""Rollout benchmark: generation tokens/s of the vLLM engine against the transformers engine, and where vLLM's
generation time goes (benchmarks/rollout_worker.py, 1 process, random Qwen2 models; each mode's sizes: SETTINGS).
Headline: `ratio` = vLLM tokens/s / hf tokens/s per (batch, length) row, every sample forced to the asked length.
On CPU both engines run `--threads` unbound OpenMP threads (default 1: on shared cores, spinning or pinned threads
stall 10x whenever another process takes one of their cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.common import SIZES, model_dir

NAME = "rollout"
WORKER = Path(__file__).resolve().parent / "rollout_worker.py"
SETTINGS = {  # mode -> models, batches, lengths, repeats, prompt length
    "full": (("qwen2-10m", "qwen2-40m"), "1x1,4x4,16x4,32x8", "32,128,224", 3, 16),
    "quick": (("qwen2-10m",), "1x1,4x2,8x4", "16,64", 2, 16),
    "tiny": (("qwen2-1m",), "1x1,2x2", "4,8", 1, 8),
}
ENGINES = ("vllm", "hf")


OPTIONS: common.Options = {
    "--repeats": {"type": int},
    "--threads": {"type": int, "default": 1, "help": "CPU: OpenMP/torch threads of both engines, unbound"},
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    args = common.options(args, OPTIONS)
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
        rec = common.run_worker(f"rollout_{model}", WORKER, 1, worker_args, env)
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


def conclusion(run: dict[str, Any]) -> str:
    ratios = [r["ratio"] for r in run["rows"]]
    big = max(run["rows"], key=lambda r: (r["batch"], r["length"]))
    text = (
        f"vLLM/hf tokens/s: {min(ratios):.2f}x to {max(ratios):.2f}x ({big['prompts']} x {big['n']} x "
        f"{big['length']} tokens: {big['ratio']:.2f}x, where vLLM takes {big['vllm_first_token_s']:.3f} s to the first "
        f"token, then {big['vllm_decode_step_ms']:.2f} ms per decode step of {big['batch']} samples, "
        f"{big['vllm_decode_share']:.0%} of the call)."
    )
    v, h = decode_fit(run, "vllm"), decode_fit(run, "hf")
    if v is None or h is None:
        return text
    text += (
        f" A decode step (fit on the {v['length']}-token rows): {v['step_ms']:.2f} ms + {v['sample_ms']:.3f} ms per "
        f"sample in vLLM, {h['step_ms']:.2f} ms + {h['sample_ms']:.3f} ms in transformers"
    )
    return text + (
        f"; in vLLM the samples outweigh the step from {v['step_ms'] / v['sample_ms']:.0f} per call."
        if v["sample_ms"] > 0
        else "."
    )


def markdown(rec: dict[str, Any]) -> str:
    parts = [
        "# Rollout benchmark: vLLM against transformers generate",
        f"{common.versions(rec)}; 1-minute load average {rec['loadavg_1m']:.1f} at the end. Both engines in one "
        f"process, temperature 1, every sample forced to `length` tokens, {rec.get('threads', 1)} CPU thread(s) "
        f"each; best of {rec['repeats']} repeats, taking turns. `ratio` = vLLM / hf tokens/s; `first token s`: a "
        "call of one new token; `decode ms/step` = (t(length) - t(1)) / (length - 1); `decode share`: the call's "
        "time after the first token.",
    ]
    for r in rec["runs"]:
        start, fixed = r["engine_start_s"], r["fixed_call_s"]
        parts += [
            f"## {r['model']} ({r['params'] / 1e6:.1f}M parameters, {r['dtype']}, {r['device']}, prompts of "
            f"{r['prompt_len']} tokens)",
            common.table([{**row, "shape": f"{row['prompts']} x {row['n']}"} for row in r["rows"]], COLUMNS),
            f"Engine start: vLLM {start['vllm']:.1f} s, hf {start['hf']:.1f} s; a call of 1 prompt and 1 token: vLLM "
            f"{fixed['vllm'] * 1e3:.1f} ms, hf {fixed['hf'] * 1e3:.1f} ms. Load average {r['loadavg_1m']:.1f}. "
            + conclusion(r),
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
    common.standalone(sys.modules[__name__])
