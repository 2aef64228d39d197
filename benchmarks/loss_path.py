"""Loss-path benchmark: peak memory of one actor update against the response length, full logits
(`HEAD_CHUNK_TOKENS=0`) against the chunked LM head, by `worker` (MemTracker; sequence_parallel's too) on SHAPES.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from benchmarks import common
from torchrl_post.distributed import ulysses
from torchrl_post.distributed.env import end_process
from torchrl_post.distributed.placement import fsdp_mesh, sequence_mesh
from torchrl_post.engines.batch import pad_samples
from torchrl_post.types import Batch
from torchrl_post.workers import logprobs

NAME = "loss_path"
QWEN_VOCAB = 151936
LENGTHS = (256, 512, 1024, 2048, 4096)
CHUNK = 1024  # torchrl_post.workers.logprobs.HEAD_CHUNK_TOKENS's default, the "after" path
HELD = ("Parameter", "Buffer", "Gradient", "Optstate")  # MemTracker's categories that are not activations
FULL_LOGITS_COPIES = 6  # float32 [tokens x vocab] tensors alive at the full-logits path's peak (measured: ~5-6)
SHAPES = {  # vocabulary, hidden, layers, response lengths, chunk: --tiny's, and every other mode's
    "tiny": (4096, 64, 1, (64, 128, 256), 64),
    "other": (QWEN_VOCAB, 64, 2, LENGTHS, CHUNK),
}
ROW_COLUMNS = [
    ("response tokens", "response_len", "{}"), ("before MiB", "before_mib", "{:.0f}"),
    ("after MiB", "after_mib", "{:.0f}"), ("before / after", "ratio", "{:.1f}x"),
]  # fmt: skip
SLOPE_COLUMNS = [
    ("", "what", "{}"), ("bytes / token", "bytes", "{:,.0f}"), ("x hidden x 4 B", "per_hidden", "{:.1f}"),
    ("x vocabulary x 4 B", "per_vocab", "{:.3f}"),
]  # fmt: skip


def build_model(out: Path, vocab: int = QWEN_VOCAB, hidden: int = 64, layers: int = 2) -> Path:
    """A random float32 Qwen2 with `vocab` rows (tied embeddings), head_dim 32; cached."""
    if common.built(out):
        return out
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 32, num_key_value_heads=1, max_position_embeddings=8192,
        tie_word_embeddings=True, dtype="float32",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


def full_logits_limit(vocab: int, lengths: tuple[int, ...], available: int) -> int:
    """The longest length whose full-logits update fits in half of `available` (0: every length fits)."""
    fits = [n for n in lengths if FULL_LOGITS_COPIES * n * vocab * 4 <= available // 2]
    return 0 if len(fits) == len(lengths) else max(fits, default=min(lengths))


def run(args: argparse.Namespace) -> dict[str, Any]:
    vocab, hidden, layers, lengths, chunk = SHAPES["tiny" if args.tiny else "other"]
    model = build_model(common.MODELS / f"qwen2-vocab{vocab}-h{hidden}-l{layers}", vocab, hidden, layers)
    limit = full_logits_limit(vocab, lengths, common.mem_available())
    env = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    paths = []
    for label, head_chunk in (("before", 0), ("after", chunk)):
        skip = limit if head_chunk == 0 else 0
        print(f"  {label}: HEAD_CHUNK_TOKENS={head_chunk}" + (f", full logits up to {skip} tokens" if skip else ""))
        worker_args = {"model": model, "chunk": head_chunk, "lengths": ",".join(map(str, lengths)), "skip_above": skip}
        rec = common.run_worker(f"loss_path_{label}", "benchmarks.loss_path", 1, worker_args, env)
        rec["results"] = [{**r, "tokens": r["response_len"]} for r in rec.pop("per_rank")[0]]  # 1 row: its response
        # the chunked path's steady state starts at one chunk (below it the chunk grows with the tokens); 0: all
        fitted = [
            (r["tokens"], r["peak_bytes"]) for r in rec["results"] if not r.get("skipped") and r["tokens"] >= head_chunk
        ]
        paths.append(rec | {"label": label, "fit": common.fit(fitted), "fit_from_tokens": head_chunk})
    rows = []
    for b, a in zip(paths[0]["results"], paths[1]["results"], strict=True):
        row = {"response_len": b["response_len"], "after_mib": a["peak_bytes"] / 2**20}
        if not b.get("skipped"):
            row |= {"before_mib": b["peak_bytes"] / 2**20, "ratio": b["peak_bytes"] / a["peak_bytes"]}
        rows.append(row)
    return {
        "vocab_size": vocab, "hidden_size": hidden, "num_layers": layers, "chunk": chunk, "rows": rows, "paths": paths,
        "hidden_bytes_per_token": hidden * 4, "vocab_bytes_per_token": vocab * 4, "full_logits_skipped_above": limit,
        "loadavg_1m": common.load_1m(),
    }  # fmt: skip


class ExchangeClock:
    """Seconds, calls and bytes sent inside `ulysses._exchange` since the last `reset`."""

    def __init__(self) -> None:
        self.inner = ulysses._exchange
        self.reset()

    def reset(self) -> None:
        self.seconds, self.calls, self.bytes = 0.0, 0, 0

    def __call__(self, x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner(x, scatter_dim, gather_dim, group)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.bytes += x.numel() * x.element_size()
        return out


def group_row(prompt: int, response: int, vocab: int, rank: int, seed: int = 0) -> Batch:
    """This rank's share of the sp group's one random on-policy row (rank 0 holds it)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (prompt + response,), generator=gen).tolist()
    batch = pad_samples([ids[:prompt]], [ids[prompt:]], [[0.0] * response], [[1.0] * response], [0], ["stop"], 0)
    batch.advantages = torch.randn(1, 1, generator=gen) * batch.loss_mask
    return batch if rank == 0 else batch.select(slice(0, 0))


def measure(actor: Any, batch: Batch, clock: ExchangeClock, timed: int) -> dict[str, Any]:
    """One tracked update (peak memory by category), then `timed` untracked ones (seconds, exchange time)."""
    tracker = MemTracker()
    tracker.track_external(actor.model, actor.optimizer)
    dist.barrier()
    t0 = time.perf_counter()
    with tracker:
        metrics = actor.update(batch)
    seconds = time.perf_counter() - t0
    peak = {k: int(v) for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items()}
    steps, exchange = [], []
    for _ in range(timed):
        dist.barrier()  # every rank starts together: an exchange does not wait for a rank still in the last step
        clock.reset()
        t0 = time.perf_counter()
        actor.update(batch)
        steps.append(time.perf_counter() - t0)
        exchange.append(clock.seconds)
    return {
        "peak": peak, "peak_bytes": peak["Total"],
        "activation_bytes": peak["Total"] - sum(peak.get(k, 0) for k in HELD), "seconds": seconds,
        "loss": float(metrics["actor/loss"]), "step_seconds": steps, "exchange_seconds": exchange,
        "exchange_calls": clock.calls, "exchange_bytes": clock.bytes,
    }  # fmt: skip


def worker(argv: list[str]) -> None:
    """Peak tensor memory (MemTracker) and time of one actor update per response length, sp = the world size."""
    args = common.worker_args(
        worker.__doc__, argv, model=Path, lengths="1024,2048", checkpointing="off", chunk=logprobs.HEAD_CHUNK_TOKENS,
        skip_above=0, prompt_len=32, timed=0,
    )  # fmt: skip
    logprobs.HEAD_CHUNK_TOKENS = args.chunk
    logprobs.HEAD_KEEP_BYTES = 0  # the head's growth with length: its kept logits are a constant (at most 512 MiB)
    env, cfg = common.worker_init("cpu", args.model)
    clock = ExchangeClock()
    ulysses._exchange = clock  # type: ignore[assignment]  # the benchmark's timing hook; _AllToAll calls it
    lengths = [int(x) for x in args.lengths.split(",")]
    results: list[dict[str, Any]] = []
    world = env.world_size
    for setting in args.checkpointing.split(","):
        cfg.model.enable_gradient_checkpointing = setting == "on"
        cfg.actor.ppo_micro_batch_size_per_gpu = 1
        sequence = sequence_mesh("cpu", world, world) if world > 1 else None
        actor = common.build_actor(
            cfg, fsdp_mesh("cpu", world, -1), torch.device("cpu"), 1, max(lengths), sequence=sequence
        )
        vocab = int(actor.model.config.vocab_size)
        actor.update(group_row(args.prompt_len, min(lengths), vocab, env.rank, seed=1))  # AdamW's state exists
        for length in lengths:
            row = {"checkpointing": setting == "on", "response_len": length}
            if args.skip_above and length > args.skip_above:
                results.append(row | {"skipped": True})
                continue
            m = measure(actor, group_row(args.prompt_len, length, vocab, env.rank), clock, args.timed)
            results.append(row | m)
            print(f"  rank {env.rank}, ckpt {setting}, response {length}: peak {m['peak_bytes'] / 2**20:.1f} MiB")
        config = actor.model.config
        del actor
    gathered = common.all_gather(results)
    if env.rank == 0:
        common.write_json(args.out, {
            "sp": world, "chunk": args.chunk, "vocab_size": vocab, "hidden_size": int(config.hidden_size),
            "num_layers": int(config.num_hidden_layers), "prompt_len": args.prompt_len, "timed": args.timed,
            "torch": torch.__version__, "per_rank": gathered,
        })  # fmt: skip
    dist.barrier()  # no rank tears gloo down while another still talks to it
    end_process()


def markdown(rec: dict[str, Any]) -> str:
    h, v, chunk = rec["hidden_bytes_per_token"], rec["vocab_bytes_per_token"], rec["chunk"]
    fits = {p["label"]: p.get("fit") for p in rec["paths"]}
    before, after = (f and f["slope_bytes_per_token"] for f in (fits["before"], fits["after"]))
    start = next(p["fit_from_tokens"] for p in rec["paths"] if p["label"] == "after")
    slopes = [
        {"what": "before: full logits (HEAD_CHUNK_TOKENS=0)", "bytes": before},
        {"what": f"after: chunked head (HEAD_CHUNK_TOKENS={chunk}), from {start} tokens", "bytes": after},
        {"what": f"hidden x 4 bytes (hidden {rec['hidden_size']})", "bytes": h},
        {"what": f"vocabulary x 4 bytes (vocabulary {rec['vocab_size']})", "bytes": v},
    ]
    for s in slopes:
        if s["bytes"] is not None:
            s |= {"per_hidden": s["bytes"] / h, "per_vocab": s["bytes"] / v}
    skipped = rec.get("full_logits_skipped_above") or 0
    intro = (
        f"A random Qwen2 with Qwen2.5's vocabulary ({rec['vocab_size']} rows, tied), hidden {rec['hidden_size']}, "
        f"{rec['num_layers']} layer(s); one `Actor.update` (FSDP2 on 1 rank, float32, AdamW) of 1 row, a 32-token "
        "prompt, per response length; peak tensor bytes from torch's MemTracker (parameters and AdamW state "
        "included). `before`: `HEAD_CHUNK_TOKENS=0`, the full [tokens x vocabulary] float32 logits; `after`: the "
        f"chunked LM head ({chunk} positions per pass)."
    )
    if skipped:
        intro += f" Full logits not run above {skipped} tokens (over half the free memory); fitted on the lengths run."
    end = ""
    if before and after:
        end = (
            f"Before, each response token costs {before / v:.1f} vocabulary rows of float32; after, {after / h:.0f} x "
            f"hidden x 4 bytes ({after / v:.3f} of one vocabulary row): the slope follows the hidden size, not the "
            f"vocabulary; the chunk is a constant ({fits['after']['intercept_bytes'] / 2**20:.0f} MiB intercept, "
            f"parameters and AdamW state included). Load average {rec['loadavg_1m']:.1f}."
        )
    return common.blocks(
        "# Loss path: peak memory of one actor update against the response length", intro,
        common.table(rec["rows"], ROW_COLUMNS), "Per-token slope (least squares; after: from one chunk on):",
        common.table(slopes, SLOPE_COLUMNS), end,
    )  # fmt: skip


def plot(path: Path, rec: dict[str, Any]) -> None:
    fig, ax = common.subplots(figsize=(7, 4.5))
    curves: list[common.Curve] = []
    for p, color in zip(rec["paths"], ("C3", "C0"), strict=True):
        ran = [r for r in p["results"] if not r.get("skipped")]
        xs = [r["tokens"] for r in ran]
        curves.append((p["label"], xs, [r["peak_bytes"] / 2**20 for r in ran], f"{color}o-"))
        if f := p.get("fit"):
            line = [x for x in xs if x >= (p["fit_from_tokens"] or min(xs))]
            ys = [(f["intercept_bytes"] + f["slope_bytes_per_token"] * x) / 2**20 for x in line]
            curves.append(
                (f"{p['label']} fit: {f['slope_bytes_per_token'] / 1024:,.1f} KiB/token", line, ys, f"{color}--")
            )
    title = f"loss path: vocabulary {rec['vocab_size']}, hidden {rec['hidden_size']}, chunk {rec['chunk']}"
    common.lines(ax, curves, title, xlabel="response tokens (1 row)", ylabel="peak tensor MiB (one actor update)")
    common.save_figure(fig, path)


if __name__ == "__main__":
    common.standalone()
