"""Peak tensor memory (and time) of one actor update per response length, under torchrun: the worker of
benchmarks/loss_path.py (1 rank, `--chunk` sets the LM head's HEAD_CHUNK_TOKENS) and benchmarks/sequence_parallel.py
(Ulysses over every rank: sp = world size, dp = 1).

Per checkpointing setting one `Actor` (FSDP2, float32, AdamW); the sp group trains one unpadded row held by rank 0.
After a warm-up update (AdamW's state), per length: one update under torch's MemTracker (exact tensor bytes on CPU;
`activation_bytes` = its peak less the parameters, buffers, gradients and optimizer state), then `--timed` untracked
updates with the time inside `distributed.ulysses._exchange` (wrapped here). Lengths above `--skip-above` (0: none)
are recorded as skipped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from benchmarks import common
from torchrl_post.config.schema import Config
from torchrl_post.distributed import ulysses
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh, sequence_mesh
from torchrl_post.types import Batch
from torchrl_post.workers import logprobs

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


def group_row(prompt: int, response: int, vocab: int, rank: int, seed: int = 0) -> Batch:
    """This rank's share of the sp group's one random on-policy row (rank 0 holds it)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (1, prompt + response), generator=gen)
    attn, loss_mask = torch.ones_like(ids), torch.ones(1, response)
    batch = Batch(
        input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0), loss_mask=loss_mask,
        rollout_log_probs=torch.zeros(1, response), group_ids=torch.zeros(1, dtype=torch.long),
        termination=torch.zeros(1, dtype=torch.long), weights=torch.ones(1),
        advantages=torch.randn(1, 1, generator=gen) * loss_mask,
    )  # fmt: skip
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


def main() -> None:
    args = common.worker_args(
        __doc__, model=Path, lengths="1024,2048", checkpointing="off", chunk=logprobs.HEAD_CHUNK_TOKENS, skip_above=0,
        prompt_len=32, timed=0,
    )  # fmt: skip
    logprobs.HEAD_CHUNK_TOKENS = args.chunk
    env = read_env("cpu")
    init_world(env)
    clock = ExchangeClock()
    ulysses._exchange = clock  # type: ignore[assignment]  # the benchmark's timing hook; _AllToAll calls it
    lengths = [int(x) for x in args.lengths.split(",")]
    results: list[dict[str, Any]] = []
    world = env.world_size
    for setting in args.checkpointing.split(","):
        cfg = Config()
        cfg.model.path = str(args.model.resolve())
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
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, results)
    if env.rank == 0:
        common.write_json(args.out, {
            "sp": world, "chunk": args.chunk, "vocab_size": vocab, "hidden_size": int(config.hidden_size),
            "num_layers": int(config.num_hidden_layers), "prompt_len": args.prompt_len, "timed": args.timed,
            "torch": torch.__version__, "per_rank": gathered,
        })  # fmt: skip
    dist.barrier()  # no rank tears gloo down while another still talks to it
    end_process()


if __name__ == "__main__":
    main()
