"""Peak activation memory and all-to-all time of one actor update per response length, with Ulysses sequence
parallelism over every rank of the run (sp = world size, dp = 1), under torchrun.

    torchrun --standalone --nproc-per-node SP benchmarks/sequence_parallel_worker.py --model DIR \
        --lengths 1024,2048 --checkpointing off,on --out FILE [--prompt-len 32 --timed 1]

Per checkpointing setting one `Actor` (FSDP2 over the SP ranks, float32, PPO clip loss, AdamW; with SP > 1 the
(dp, sp) = (1, SP) `sequence_mesh`) is built with room for the longest response. The sp group trains the union of
its ranks' rows: rank 0 holds one row (a `prompt-len`-token prompt and a response of the length, no padding) and
the others none, so every rank runs its 1/SP of the same row's tokens. One warm-up update at the shortest length
creates AdamW's state; then per length:

- memory: one update under torch's MemTracker (every tensor storage alive through forward, backward and optimizer
  step; the parameters, gradients and AdamW state registered with `track_external`). `activation_bytes` is the
  tracked total at its peak less the parameters, buffers, gradients and optimizer state at that moment: the
  forward's saved tensors and the backward's temporaries (FSDP's gathered parameters, small here, among them).
- time: `--timed` more updates, untracked (the tracker's dispatch slows every op). Each rank times its update and
  the time spent inside `distributed.ulysses._exchange` (every seq_to_heads / heads_to_seq, forward, backward and a
  checkpointed layer's recomputation: the copies into and out of the buffers and the all_to_all_single, waiting
  for the other ranks included), by wrapping that function here: the library is not changed.

Rank 0 writes one JSON record with every rank's numbers.
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

from benchmarks.loss_path_worker import make_batch
from torchrl_post.config.schema import Config
from torchrl_post.distributed import ulysses
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh, sequence_mesh
from torchrl_post.types import Batch
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
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--timed", type=int, default=1, help="untracked updates per length, for the step time")
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


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
        mini_batch_samples=1, micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu, max_response_length=longest, total_steps=1,
        sequence=sequence_mesh("cpu", world, world) if world > 1 else None,
    )  # fmt: skip


def measure(actor: Actor, batch: Batch, clock: ExchangeClock, timed: int) -> dict[str, Any]:
    """One tracked update (peak memory by category), then `timed` untracked ones (seconds, exchange time)."""
    tracker = MemTracker()
    tracker.track_external(actor.model, actor.optimizer)
    dist.barrier()
    with tracker:
        actor.update(batch)
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
        "step_seconds": steps,
        "exchange_seconds": exchange,
        "exchange_calls": clock.calls,
        "exchange_bytes": clock.bytes,
    }


def main() -> None:
    args = parse_args()
    env = read_env("cpu")
    init_world(env)
    clock = ExchangeClock()
    ulysses._exchange = clock  # type: ignore[assignment]  # the benchmark's timing hook; _AllToAll calls it
    lengths = [int(x) for x in args.lengths.split(",")]
    results = []
    for setting in args.checkpointing.split(","):
        actor = build_actor(args.model, setting == "on", max(lengths), env.world_size)
        vocab = int(actor.model.config.vocab_size)
        # AdamW's state exists before the first measurement
        actor.update(group_row(args.prompt_len, min(lengths), vocab, env.rank, seed=1))
        for length in lengths:
            t0 = time.perf_counter()
            m = measure(actor, group_row(args.prompt_len, length, vocab, env.rank), clock, args.timed)
            results.append({"checkpointing": setting == "on", "response_len": length, **m})
            print(
                f"  rank {env.rank}/{env.world_size}, checkpointing {setting}, response {length}: activations "
                f"{m['activation_bytes'] / 2**20:.1f} MiB (peak {m['peak_bytes'] / 2**20:.1f}), step "
                f"{min(m['step_seconds']):.2f} s, exchange {min(m['exchange_seconds']):.2f} s "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
        del actor
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, results)
    if env.rank == 0:
        rec = {
            "sp": env.world_size,
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
