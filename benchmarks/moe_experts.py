"""Mixture-of-experts benchmark: one forward and backward of a random Qwen3-MoE per
`model.experts_implementation` (IMPLEMENTATIONS), in this process, the same weights for each (`with_experts`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "moe_experts"
IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")
VOCAB = 128
FLOAT32_ATOL = 1e-5  # loss and gradients of every implementation against eager's, float32
BATCHED_MM_MEMORY_SHARE = 4  # batched_mm runs where its gathered weights take at most 1/4 of the free memory


@dataclass(frozen=True)
class MoeSize:
    """A random Qwen3-MoE: every layer sparse (decoder_sparse_step 1), no shared expert, head_dim hidden / heads."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int
    top_k: int
    expert_width: int  # moe_intermediate_size


SIZES = (MoeSize("tiny (test model)", 64, 2, 2, 1, 4, 2, 64), MoeSize("larger", 512, 4, 8, 2, 8, 2, 512))
SHAPE = {"full": (8, 256, 2, 9), "quick": (8, 256, 2, 9), "tiny": (2, 32, 1, 2)}  # batch, seq, warm-up, timed rounds
COLUMNS = [
    ("size", "size", "{}"), ("dtype", "dtype", "{}"), ("implementation", "implementation", "{}"),
    ("fwd+bwd ms", "ms", "{:.1f}"), ("wall ms", "wall_ms", "{:.1f}"), ("speed-up vs eager", "speedup", "{:.2f}x"),
    ("wall speed-up", "wall_speedup", "{:.2f}x"), ("loss diff", "loss_diff", "{:.1e}"),
    ("max grad diff", "grad_diff", "{:.1e}"), ("", "note", "{}"),
]  # fmt: skip
OPTIONS: common.Options = {
    "--threads": {"type": int, "default": 1, "help": "torch threads (1: steadier on shared cores)"}
}


def batched_mm_bytes(size: MoeSize, tokens: int, dtype_bytes: int) -> int:
    """What batched_mm gathers: per layer and routed (token, expert) pair, gate_up and down weights (3 x width x
    hidden), all kept for the backward."""
    return size.num_layers * tokens * size.top_k * 3 * size.expert_width * size.hidden_size * dtype_bytes


def build(size: MoeSize, dtype: Any) -> Any:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=size.hidden_size, intermediate_size=2 * size.hidden_size,  # unused: all sparse
        moe_intermediate_size=size.expert_width, num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads, num_key_value_heads=size.num_kv_heads, num_experts=size.num_experts,
        num_experts_per_tok=size.top_k, decoder_sparse_step=1, max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen3MoeForCausalLM(cfg).to(dtype)


def measure(model: Any, ids: Any, impls: list[str], warmup: int, repeats: int) -> dict[str, dict[str, Any]]:
    """impl -> {"cpu", "wall": the timed passes' seconds; "loss", "grads": the first pass's}, in interleaved rounds."""
    from torchrl_post.config.schema import ModelConfig
    from torchrl_post.workers.models import with_experts

    out: dict[str, dict[str, Any]] = {impl: {"cpu": [], "wall": []} for impl in impls}
    for r in range(warmup + repeats):
        for impl in impls:
            with_experts(model, ModelConfig(experts_implementation=impl))
            assert model.config._experts_implementation == impl
            model.zero_grad(set_to_none=True)
            start, start_cpu = time.perf_counter(), time.process_time()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            if r == 0:
                out[impl]["loss"] = loss.item()
                out[impl]["grads"] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            if r >= warmup:
                out[impl]["wall"].append(wall)
                out[impl]["cpu"].append(cpu)
    model.zero_grad(set_to_none=True)
    return out


def max_grad_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[n].float() - b[n].float()).abs().max().item() for n in a)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    sizes, dtypes = (SIZES[:1], ("float32",)) if args.tiny else (SIZES, ("float32", "bfloat16"))
    batch, seq, warmup, repeats = SHAPE[common.mode(args)]
    torch.set_num_threads(args.threads)
    common.warn_if_busy()
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))
    rows, budget = [], common.mem_available() // BATCHED_MM_MEMORY_SHARE
    for size in sizes:
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            model = build(size, dtype)
            gathered = batched_mm_bytes(size, batch * seq, dtype.itemsize)
            runs = measure(
                model, ids, [i for i in IMPLEMENTATIONS if i != "batched_mm" or gathered <= budget], warmup, repeats
            )
            eager = runs["eager"]
            for impl in IMPLEMENTATIONS:
                row: dict[str, Any] = {"size": size.name, "dtype": dtype_name, "implementation": impl}
                rows.append(row)
                if (got := runs.get(impl)) is None:
                    row["skipped"] = f"would gather {gathered / 2**30:.0f} GiB of expert weights"
                    continue
                row |= {
                    "ms": 1e3 * statistics.median(got["cpu"]), "wall_ms": 1e3 * statistics.median(got["wall"]),
                    "cpu_ms_each": [1e3 * t for t in got["cpu"]], "wall_ms_each": [1e3 * t for t in got["wall"]],
                    "loss": got["loss"],
                }  # fmt: skip
                if impl != "eager":
                    rounds = {k: [e / t for e, t in zip(eager[k], got[k], strict=True)] for k in ("cpu", "wall")}
                    row |= {
                        "speedup": statistics.median(rounds["cpu"]), "wall_speedup": statistics.median(rounds["wall"]),
                        "loss_diff": abs(got["loss"] - eager["loss"]), "grad_diff": max_grad_diff(got["grads"], eager["grads"]),
                    }  # fmt: skip
                    if dtype_name == "float32":
                        row["agrees"] = row["loss_diff"] <= FLOAT32_ATOL and row["grad_diff"] <= FLOAT32_ATOL
                print(f"  {size.name} {dtype_name} {impl}: {row['ms']:.1f} ms CPU", flush=True)
            del model, runs, eager
    return {
        "sizes": [asdict(s) for s in sizes], "batch": batch, "seq": seq, "warmup": warmup, "repeats": repeats,
        "threads": torch.get_num_threads(), "rows": rows, "loadavg_1m": common.load_1m(),
    }  # fmt: skip


def markdown(rec: dict[str, Any]) -> str:
    rows = [r | {"note": r.get("skipped") or ("" if r.get("agrees", True) else f"DISAGREES beyond {FLOAT32_ATOL:g}")}
            for r in rec["rows"]]  # fmt: skip
    sizes = "; ".join(
        f"{s['name']}: hidden {s['hidden_size']}, {s['num_layers']} layers, {s['num_experts']} experts, "
        f"top-{s['top_k']}, expert width {s['expert_width']}"
        for s in rec["sizes"]
    )
    f32 = [r for r in rows if r["dtype"] == "float32" and "grad_diff" in r]
    worst = max((max(r["loss_diff"], r["grad_diff"]) for r in f32), default=None)
    lines = [
        "# Mixture-of-experts: the experts' implementation in one forward and backward\n",
        f"A random Qwen3-MoE ({sizes}; vocabulary {VOCAB}), {rec['batch']} x {rec['seq']} tokens, the causal-LM "
        f"loss, forward and backward on the CPU ({rec['threads']} thread{'s' * (rec['threads'] > 1)}), the same "
        f"weights for each `model.experts_implementation`: {rec['repeats']} timed rounds after {rec['warmup']} "
        "warm-up, each one pass of every implementation in turn. ms: the median pass in the process's CPU time "
        "(other processes' share of the cores left out), wall: in wall time; speed-up: the median over rounds of "
        "eager's time over the implementation's. Diffs: the largest from eager's loss and gradients (first round).\n",
        common.table(rows, COLUMNS),
    ]
    for impl in IMPLEMENTATIONS[1:]:
        ups = [r["speedup"] for r in rows if r["implementation"] == impl and r.get("speedup") is not None]
        skipped = sum(1 for r in rows if r["implementation"] == impl and r.get("skipped"))
        if ups:
            lines.append(
                f"{impl} against eager: {min(ups):.2f}x to {max(ups):.2f}x over the {len(ups)} runs"
                + (f" ({skipped} skipped: memory)." if skipped else ".")
            )
    if worst is not None:
        lines.append(
            f"In float32 every implementation gives eager's loss and gradients to {worst:.1e} (at most). Load "
            f"average {rec['loadavg_1m']:.1f} at the end on {rec['machine']['cpu_count']} cores (above 1: other "
            "processes shared them, in wall times more than CPU times)."
        )
    return "\n".join(lines) + "\n"


def plot(path: Path, rec: dict[str, Any]) -> None:
    groups = list(dict.fromkeys((r["size"], r["dtype"]) for r in rec["rows"]))
    by = {(r["size"], r["dtype"], r["implementation"]): r for r in rec["rows"]}
    fig, ax = common.subplots(figsize=(8, 4.2))
    speedup = {k: r.get("speedup", 1.0) if r.get("ms") is not None else None for k, r in by.items()}
    series = [(impl, [speedup[(s, d, impl)] for s, d in groups]) for impl in IMPLEMENTATIONS]
    common.bars(ax, [f"{s}\n{d}" for s, d in groups], series, "{:.2f}x", "speed-up vs eager (fwd+bwd)")
    ax.axhline(1.0, color="grey", lw=0.8)
    threads = f"{rec['threads']} thread{'s' * (rec['threads'] > 1)}"
    ax.set_title(
        f"Qwen3-MoE experts, {rec['batch']} x {rec['seq']} tokens, CPU time on {threads} (no bar: skipped)", fontsize=10
    )
    common.save_figure(fig, path)


if __name__ == "__main__":
    common.standalone()
