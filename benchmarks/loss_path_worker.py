"""Peak tensor memory of one actor update per response length, for one LM-head path, under torchrun (1 rank).

    torchrun --standalone --nproc-per-node 1 benchmarks/loss_path_worker.py --model DIR --chunk 0|1024 \
        --lengths 256,512,1024,2048,4096 --out FILE [--prompt-len 32 --rows 1 --skip-above 0]

`--chunk` sets `torchrl_post.workers.logprobs.HEAD_CHUNK_TOKENS` (0: the full-logits path, the fallback; N > 0:
the chunked LM head, N positions per pass). One `Actor` (FSDP2 over the one rank, float32, the PPO clip loss,
AdamW) is built with room for the longest response; one warm-up update at the shortest length creates AdamW's
state, then each length gets one update of `rows` random rows (prompt `prompt-len` tokens, response the length,
no padding) measured by torch's MemTracker (torch.distributed._tools.mem_tracker): a TorchDispatchMode that
follows every tensor storage alive through the forward, the backward and the optimizer step (the parameters,
gradients and optimizer state registered with `track_external`) and records the peak of their bytes. Exact tensor
bytes on CPU, not the process's RSS (allocator caching and the interpreter do not enter it). Lengths above
`--skip-above` tokens (0: none) are not run (the caller's memory guard). Writes one JSON record.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.types import Batch
from torchrl_post.workers import logprobs
from torchrl_post.workers.actor import Actor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--chunk", type=int, required=True, help="HEAD_CHUNK_TOKENS (0: full logits)")
    ap.add_argument("--lengths", default="256,512,1024,2048,4096")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--skip-above", type=int, default=0, help="do not run lengths above this (0: run all)")
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


def live_bytes(actor: Actor) -> int:
    """Bytes of the parameters, gradients and optimizer state held between updates (shards: one rank)."""
    seen: set[int] = set()
    total = 0
    tensors = [p.to_local() if hasattr(p, "to_local") else p for p in actor.model.parameters()]
    for state in actor.optimizer.state.values():
        tensors += [v.to_local() if hasattr(v, "to_local") else v for v in state.values() if torch.is_tensor(v)]
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def main() -> None:
    args = parse_args()
    logprobs.HEAD_CHUNK_TOKENS = args.chunk
    env = read_env("cpu")
    init_world(env)
    lengths = [int(x) for x in args.lengths.split(",")]
    cfg = Config()
    cfg.model.path = str(args.model.resolve())
    cfg.actor.ppo_micro_batch_size_per_gpu = args.rows
    mesh = fsdp_mesh(env.device.type, env.world_size, -1)
    actor = Actor(
        cfg.model,
        cfg.actor,
        mesh,
        env.device,
        temperature=1.0,
        mini_batch_samples=args.rows,
        micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu,
        max_response_length=max(lengths),
        total_steps=1,
    )
    vocab = int(actor.model.config.vocab_size)
    actor.update(make_batch(args.rows, args.prompt_len, min(lengths), vocab, seed=1))  # AdamW's state exists
    rows = []
    for length in lengths:
        if args.skip_above and length > args.skip_above:
            rows.append({"response_len": length, "skipped": True})
            continue
        batch = make_batch(args.rows, args.prompt_len, length, vocab)
        held = live_bytes(actor)
        tracker = MemTracker()
        tracker.track_external(actor.model, actor.optimizer)
        t0 = time.perf_counter()
        with tracker:
            metrics = actor.update(batch)
        seconds = time.perf_counter() - t0
        peak = int(tracker.get_tracker_snapshot("peak")[env.device]["Total"])
        rows.append(
            {
                "response_len": length,
                "tokens": args.rows * length,
                "peak_bytes": peak,
                "held_bytes": held,
                "update_peak_bytes": peak - held,
                "seconds": seconds,
                "loss": float(metrics["actor/loss"]),
            }
        )
        print(
            f"  chunk {args.chunk}, response {length}: peak {peak / 2**20:.1f} MiB ({(peak - held) / 2**20:.1f} MiB "
            f"above the {held / 2**20:.1f} MiB held), {seconds:.1f} s",
            flush=True,
        )
    config = actor.model.config
    rec = {
        "chunk": args.chunk,
        "vocab_size": vocab,
        "hidden_size": int(config.hidden_size),
        "num_layers": int(config.num_hidden_layers),
        "params": sum(p.numel() for p in actor.model.parameters()),
        "prompt_len": args.prompt_len,
        "rows": args.rows,
        "torch": torch.__version__,
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    end_process()


if __name__ == "__main__":
    main()
