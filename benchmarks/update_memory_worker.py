"""Peak tensor memory (and time) of one actor update per response length, under torchrun: the worker of
benchmarks/loss_path.py (1 rank, `--chunk` sets the LM head's HEAD_CHUNK_TOKENS) and
benchmarks/sequence_parallel.py (Ulysses over every rank: sp = world size, dp = 1).

    torchrun --standalone --nproc-per-node SP benchmarks/update_memory_worker.py --model DIR --lengths 1024,2048 \
        --out FILE [--checkpointing off,on --chunk N --skip-above N --timed 0 --prompt-len 32]

Per checkpointing setting one `Actor` (FSDP2 over the ranks, float32, PPO clip loss, AdamW) is built with room for
the longest response. The sp group trains one row (a `prompt-len`-token prompt and the response, no padding) held
by rank 0, so every rank runs its 1/sp of the row's tokens. A warm-up update at the shortest length creates AdamW's
state; then per length:

- memory: one update under torch's MemTracker, a TorchDispatchMode that follows every tensor storage alive through
  forward, backward and optimizer step (parameters, gradients and AdamW state registered with `track_external`):
  exact tensor bytes on CPU, not RSS. `activation_bytes` is its peak less the parameters, buffers, gradients and
  optimizer state at that moment.
- time: `--timed` more updates, untracked, and the time inside `distributed.ulysses._exchange` (the all-to-alls,
  their copies, waiting for the other ranks), by wrapping that function here: the library is not changed.

Lengths above `--skip-above` (0: none) are recorded as skipped (the caller's memory guard). Rank 0 writes one JSON
record with every rank's numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from torchrl_post.config.schema import Config
from torchrl_post.distributed import ulysses
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh, sequence_mesh
from torchrl_post.types import Batch
from torchrl_post.workers import logprobs
from torchrl_post.workers.actor import Actor

HELD = ("Parameter", "Buffer", "Gradient", "Optstate")  # MemTracker's categories that are not activations


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--checkpointing", default="off", help="comma-separated off / on")
    ap.add_argument("--chunk", type=int, default=logprobs.HEAD_CHUNK_TOKENS, help="HEAD_CHUNK_TOKENS (0: full)")
    ap.add_argument("--skip-above", type=int, default=0, help="do not run lengths above this (0: run all)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--timed", type=int, default=0, help="untracked updates per length, for the step time")
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def make_batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0) -> Batch:
    """`rows` rows of random tokens, no padding, random advantages, on-policy (no old logprobs)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=gen)
    attn = torch.ones_like(ids)
    loss_mask = torch.ones(rows, response)
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        loss_mask=loss_mask,
        rollout_log_probs=torch.zeros(rows, response),
        group_ids=torch.zeros(rows, dtype=torch.long),
        termination=torch.zeros(rows, dtype=torch.long),
        weights=torch.ones(rows),
        advantages=torch.randn(rows, 1, generator=gen) * loss_mask,
    )


def group_row(prompt: int, response: int, vocab: int, rank: int, seed: int = 0) -> Batch:
    """This rank's share of the sp group's rows: one row on rank 0, none elsewhere (the union is that row)."""
    batch = make_batch(1, prompt, response, vocab, seed=seed)
    return batch if rank == 0 else batch.select(slice(0, 0))


def build_actor(model: Path, checkpointing: bool, longest: int, world: int) -> Actor:
    cfg = Config()
    cfg.model.path = str(model.resolve())
    cfg.model.enable_gradient_checkpointing = checkpointing
    cfg.actor.ppo_micro_batch_size_per_gpu = 1
    return Actor(
        cfg.model, cfg.actor, fsdp_mesh("cpu", world, -1), torch.device("cpu"), temperature=1.0,
        mini_batch_samples=1, micro_batch_samples=1, max_response_length=longest, total_steps=1,
        sequence=sequence_mesh("cpu", world, world) if world > 1 else None,
    )  # fmt: skip


def measure(actor: Actor, batch: Batch, clock: ExchangeClock, timed: int) -> dict[str, Any]:
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
        "peak": peak,
        "peak_bytes": peak["Total"],
        "activation_bytes": peak["Total"] - sum(peak.get(k, 0) for k in HELD),
        "seconds": seconds,
        "loss": float(metrics["actor/loss"]),
        "step_seconds": steps,
        "exchange_seconds": exchange,
        "exchange_calls": clock.calls,
        "exchange_bytes": clock.bytes,
    }


def main() -> None:
    args = parse_args()
    logprobs.HEAD_CHUNK_TOKENS = args.chunk
    env = read_env("cpu")
    init_world(env)
    clock = ExchangeClock()
    ulysses._exchange = clock  # type: ignore[assignment]  # the benchmark's timing hook; _AllToAll calls it
    lengths = [int(x) for x in args.lengths.split(",")]
    results: list[dict[str, Any]] = []
    for setting in args.checkpointing.split(","):
        actor = build_actor(args.model, setting == "on", max(lengths), env.world_size)
        vocab = int(actor.model.config.vocab_size)
        actor.update(group_row(args.prompt_len, min(lengths), vocab, env.rank, seed=1))  # AdamW's state exists
        for length in lengths:
            if args.skip_above and length > args.skip_above:
                results.append({"checkpointing": setting == "on", "response_len": length, "skipped": True})
                continue
            m = measure(actor, group_row(args.prompt_len, length, vocab, env.rank), clock, args.timed)
            results.append({"checkpointing": setting == "on", "response_len": length, **m})
            print(
                f"  rank {env.rank}/{env.world_size}, checkpointing {setting}, chunk {args.chunk}, response {length}: "
                f"peak {m['peak_bytes'] / 2**20:.1f} MiB, activations {m['activation_bytes'] / 2**20:.1f} MiB, "
                f"{m['seconds']:.1f} s",
                flush=True,
            )
        config = actor.model.config
        del actor
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, results)
    if env.rank == 0:
        rec = {
            "sp": env.world_size,
            "chunk": args.chunk,
            "vocab_size": vocab,
            "hidden_size": int(config.hidden_size),
            "num_layers": int(config.num_hidden_layers),
            "prompt_len": args.prompt_len,
            "timed": args.timed,
            "torch": torch.__version__,
            "per_rank": gathered,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rec, indent=1) + "\n")
    dist.barrier()  # no rank tears gloo down while another still talks to it
    end_process()


if __name__ == "__main__":
    main()
