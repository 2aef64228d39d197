"""Run under torchrun by test_disaggregated.py: parity across ranks after the broadcast weight sync.

    torchrun --nproc-per-node 3|4 tests/distributed/disagg_parity_worker.py <model_dir> <tp> <out.json>

Actor ranks [0, 1] train under FSDP2; the vLLM engine lives on the rollout ranks ([2], or [2, 3] as one
tensor-parallel engine). After each update, the actor's first rank broadcasts the weights in flat buckets;
the engine's greedy tokens and logprobs travel back (the trainer's transfer) and must equal the trainer's
argmax and logprobs. The second update is polled for (`BroadcastSync.incoming`, rollout.update_on_arrival).
Rank 0 writes the measured differences.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from tests.distributed.checks import actor_rollout_topology, engine_vs_trainer, make_actor, parity_prompts
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, read_env
from torchrl_post.distributed.transfer import route
from torchrl_post.engines.base import SamplingParams, generate
from torchrl_post.engines.batch import collate
from torchrl_post.engines.build import build_engine
from torchrl_post.plan import engine_spec, lora_sync
from torchrl_post.sync.lora import is_adapter
from torchrl_post.sync.weights import BroadcastSync
from torchrl_post.types import Batch, Generation


def main() -> None:
    model_dir, tp, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cfg = Config()
    cfg.model.path = model_dir
    if sys.argv[4:5] in (["lora"], ["lora-adapter"]):  # merged weights, or only the adapter, over the broadcast
        cfg.model.lora_rank, cfg.model.lora_alpha = 8, 16
        cfg.rollout.lora_sync = "adapter" if sys.argv[4] == "lora-adapter" else "merged"
    keep = is_adapter if lora_sync(cfg) == "adapter" else None
    cfg.data.max_prompt_length, cfg.data.max_response_length = 32, 6
    cfg.rollout.max_num_seqs, cfg.rollout.tensor_parallel_size = 64, tp
    cfg.actor.lr, cfg.actor.ppo_micro_batch_size_per_gpu = 5e-3, 4
    env = read_env("cpu")
    topo = actor_rollout_topology(env)
    assert topo.world is not None
    torch.manual_seed(0)
    is_actor = env.rank in (0, 1)
    actor = make_actor(cfg, topo.mesh("actor")) if is_actor else None
    engine = None if is_actor else build_engine(cfg.model, cfg.rollout, engine_spec(cfg), env.device, 0, 0, [3])
    # 1 KiB buckets: many buckets, so the pipelined broadcast (two in flight) is exercised.
    sync = BroadcastSync(
        topo.sync, env.device, 1 << 10, torch.float32, actor.model if actor else None, keep, topo.store
    )
    gen = torch.Generator().manual_seed(100)
    pb, spec, pad = parity_prompts(model_dir, gen)  # a vision-language model's carry images
    greedy = SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_tokens=6, seed=0)
    # Greedy samples from rank 2 to both actor ranks: items 0..3 to rank 0, 10..13 to rank 1.
    owner = {g: 2 for g in (0, 1, 2, 3, 10, 11, 12, 13)}
    dest = {g: 0 if g < 10 else 1 for g in owner}
    results = []
    last: Batch | None = None
    for update in range(3):
        if update > 0:
            # Update 2 is received as rollout.update_on_arrival does: its announcement is polled; the sender starts
            # only after a barrier the receivers reach once they saw it had not arrived.
            on_arrival = update == 2
            if actor is not None:
                assert last is not None
                rb = last
                rb.advantages = torch.randn(len(rb), 1, generator=gen) * rb.loss_mask
                actor.update(rb)
                if on_arrival:
                    topo.world.barrier().wait()
                sync.send(actor.model)
            elif on_arrival:
                assert engine is not None
                incoming = sync.incoming()
                assert not incoming.arrived(), "the update arrived before anything was sent"
                topo.world.barrier().wait()
                deadline = time.monotonic() + 300
                while not incoming.arrived():
                    assert time.monotonic() < deadline, "the update was never announced"
                    time.sleep(0.01)
                engine.load_weights(incoming.weights())
            else:
                assert engine is not None
                sync.receive(engine)
        items = {}
        if engine is not None:
            g_out = generate(engine, pb.prompt_ids, pb.uids, greedy, pb.images or None)
            if env.rank == 2:
                for i in range(4):
                    one = ([g_out.response_ids[i]], [g_out.logprobs[i]], [g_out.finish_reasons[i]])
                    items[i], items[10 + i] = one, one
        got = route(topo.world, items, owner, dest)
        if actor is None:
            continue
        g_all = Generation([], [], [])
        for i in range(4):
            ids, lps, fins = got[i + 10 * env.rank]
            g_all.response_ids += ids
            g_all.logprobs += lps
            g_all.finish_reasons += fins
        last = collate(pb, g_all, 1, pad, spec)
        results.append({"update": update, **engine_vs_trainer(actor.model, last)})
    # The rollout ranks' aliases (from the shared plan), to rank 0: the receivers must agree with the sender.
    got_aliases = route(topo.world, {99: list(sync.aliases)} if env.rank == 2 else {}, {99: 2}, {99: 0})
    aliases = {"aliases": got_aliases[99]} if env.rank == 0 else {}
    if env.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"results": results, "sync_bytes": sync.nbytes, "buckets": len(sync.buckets), **aliases}, f)
    topo.world.barrier().wait()
    if engine is not None:
        engine.shutdown(process_ends=True)  # end_process follows
    end_process()


if __name__ == "__main__":
    main()
