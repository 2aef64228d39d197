"""Run under torchrun by test_sync_parity.py: FSDP2 actor + colocated engine, several updates, parity after each.

    torchrun --nproc-per-node 2 tests/distributed/parity_worker.py <model_dir> <engine> <out.json> [MODE]

MODE: `lora` (the adapter trains, merged sync), `lora-adapter` (the adapter sync), or `then-lora`: the plain
run, then the same engine synced from a LoRA actor (merged) for three parity checks, and the merged stream
with `model.layers.1.mlp.experts.down_proj` left out (for an MoE model: its accounting). One vLLM launch for both.

A vision-language model directory runs the same checks on prompts with images (the actor trains its vision
tower too, so the engine's encoder cache must be reset on every sync).

The engine starts as in training (rollout.load_format=dummy, then the first sync): update 0 checks that the
first sync gives it the trainer's weights, and every tensor it needs that no sync sends (vLLM's Qwen-VL input
normalisation buffers). After every update and sync, greedy tokens from the engine must be the trainer's argmax tokens and the
engine's per-token logprobs must equal the trainer's (float32, CPU). Writes the measured differences. A text
model without LoRA then syncs twice more, each time leaving one parameter out (`model.norm.weight`, then
`lm_head.weight`), and writes what the engine's load_weights raised (the accounting: "" when nothing).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.distributed as dist

from tests.distributed.checks import engine_vs_trainer, make_actor, parity_prompts
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.engines.base import RolloutEngine, SamplingParams, generate
from torchrl_post.engines.batch import collate
from torchrl_post.engines.build import build_engine
from torchrl_post.multimodal.vision import VisionSpec
from torchrl_post.plan import engine_spec, lora_sync
from torchrl_post.sync.lora import is_adapter, lora_scale, merged_weights
from torchrl_post.sync.weights import Keep, iter_full_weights, sync_weights, tied_aliases, with_aliases
from torchrl_post.types import PromptBatch
from torchrl_post.workers.actor import Actor

MODES = ("lora", "lora-adapter", "then-lora")


def driver_matches_llm_generate(engine: Any, prompts: list[list[int]]) -> bool:
    """The stepped driver (`engines.base.generate`) against vLLM's own `LLM.generate` with the same seeds: the same
    tokens and logprobs, bit for bit (what keeps whole-batch runs as they were)."""
    params = SamplingParams(4, 1.0, 1.0, -1, 6, seed=5)
    uids = list(range(len(prompts)))
    ours = generate(engine, prompts, uids, params)
    outs = engine.llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [engine._sampling(params, u, 4) for u in uids],
        use_tqdm=False,
        lora_request=engine.lora_request,
    )
    ids = [list(c.token_ids) for o in outs for c in o.outputs]
    lps = [[lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)] for o in outs for c in o.outputs]
    return ours.response_ids == ids and ours.logprobs == lps


def main() -> None:
    model_dir, engine_name, out_path = sys.argv[1:4]
    cfg = Config()
    cfg.model.path = model_dir
    mode = next((a for a in sys.argv[4:] if a in MODES), "")  # tests/conftest.py may append overrides
    if mode in ("lora", "lora-adapter"):  # the adapter trains; merged weights or the adapter sync
        cfg.model.lora_rank, cfg.model.lora_alpha = 8, 16
        cfg.rollout.lora_sync = "adapter" if mode == "lora-adapter" else "merged"
    cfg.rollout.engine = engine_name
    cfg.data.max_prompt_length, cfg.data.max_response_length = 32, 6
    cfg.rollout.max_num_seqs = 512
    cfg.actor.lr = 5e-3
    cfg.actor.ppo_micro_batch_size_per_gpu = 4
    env = read_env("cpu")
    init_world(env)
    mesh = fsdp_mesh(env.device.type, env.world_size, -1)
    torch.manual_seed(0)
    actor = make_actor(cfg, mesh)
    if mode == "then-lora":  # a merging engine: the plain actor's stream, without adapters, passes through it
        cfg.model.lora_rank, cfg.model.lora_alpha = 8, 16
    # As the training loop starts it: rollout.load_format=dummy (the default), then the first sync before any
    # generation (an adapter-mode engine reads its base weights and gets the initial adapter).
    engine = build_engine(cfg.model, cfg.rollout, engine_spec(cfg, first_sync=True), env.device, env.rank, 0, [3])
    keep = is_adapter if lora_sync(cfg) == "adapter" else None
    gen = torch.Generator().manual_seed(100 + env.rank)
    pb, spec, pad = parity_prompts(model_dir, gen)  # a vision-language model's carry images
    results = parity_run(actor, engine, keep, pb, spec, pad, gen, updates=4)
    # A batch larger than vLLM's default token budget (4096 on CPU): every prefill stays whole on CPU, where a split
    # seeded prefill crashes vLLM 0.32 ("CPU Generator does not use offset").
    if spec is None:
        big = [torch.randint(5, 100, (25,), generator=gen).tolist() for _ in range(100)]
        big_gen = generate(engine, big, list(range(100)), SamplingParams(4, 1.0, 1.0, -1, 6, seed=3))
        assert len(big_gen.response_ids) == 400
    if spec is None and engine_name == "vllm":
        out_driver = driver_matches_llm_generate(engine, big[:8])
    out = {"rank": env.rank, "results": results, "greedy_tokens_changed": moved(results)}
    if spec is None and engine_name == "vllm":
        out["driver_equals_llm_generate"] = out_driver
    out["aliases"] = tied_aliases(actor.model)
    if spec is None and mode in ("", "then-lora"):
        out["left_out"] = left_out_errors(actor.model, engine)
    if mode == "then-lora":  # the same engine, now synced from a LoRA actor (merged: W + scale * B @ A)
        torch.manual_seed(1)
        lora_actor = make_actor(cfg, mesh)
        out["lora_results"] = parity_run(lora_actor, engine, None, pb, spec, pad, gen, updates=3)
        out["lora_greedy_tokens_changed"] = moved(out["lora_results"])
        merged = merged_weights(iter_full_weights(lora_actor.model, 1 << 20), lora_scale(8, 16))
        try:  # the merged stream without one expert tensor: the engine must say what it missed
            engine.load_weights((n, t) for n, t in merged if n != "model.layers.1.mlp.experts.down_proj")
            out["lora_left_out"] = ""
        except RuntimeError as e:
            out["lora_left_out"] = str(e)
    gathered: list[object] = [None] * env.world_size
    dist.all_gather_object(gathered, out)
    if env.rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    engine.shutdown(process_ends=True)  # end_process follows
    end_process()


def parity_run(
    actor: Actor,
    engine: RolloutEngine,
    keep: Keep | None,
    pb: PromptBatch,
    spec: VisionSpec | None,
    pad: int,
    gen: torch.Generator,
    updates: int,
) -> list[dict[str, Any]]:
    """Sync, then `updates` times: greedy parity against the trainer, and (but the last time) a real update (sampled
    responses, random advantages, one optimizer step) and a sync."""
    images = pb.images or None
    greedy = SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_tokens=6, seed=0)
    sample = SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=6, seed=1)
    sync_weights(actor.model, engine, bucket_bytes=1 << 20, keep=keep)
    results = []
    for update in range(updates):
        if update > 0:
            rb = collate(pb, generate(engine, pb.prompt_ids, pb.uids, sample, images), 2, pad, spec)
            rb.advantages = torch.randn(len(rb), 1, generator=gen) * rb.loss_mask
            actor.update(rb)
            sync_weights(actor.model, engine, bucket_bytes=1 << 20, keep=keep)
        rb = collate(pb, generate(engine, pb.prompt_ids, pb.uids, greedy, images), 1, pad, spec)
        results.append({"update": update, **engine_vs_trainer(actor.model, rb)})
    return results


def moved(results: list[dict[str, Any]]) -> bool:
    """The greedy tokens of the last parity check differ from the first's: the weights really moved, or parity
    would be trivial."""
    first, last = torch.tensor(results[0]["tokens"]), torch.tensor(results[-1]["tokens"])
    return first.shape != last.shape or bool((first != last).any())


def left_out_errors(model: torch.nn.Module, engine: RolloutEngine) -> dict[str, str]:
    """A sync's stream (tied embeddings under both names) with one parameter left out, for each of
    `model.norm.weight` and `lm_head.weight`: what the engine's load_weights raised ("" if it did not)."""
    errors = {}
    for drop in ("model.norm.weight", "lm_head.weight"):
        stream = with_aliases(iter_full_weights(model, 1 << 20), tied_aliases(model))
        try:
            engine.load_weights((name, t) for name, t in stream if name != drop)
            errors[drop] = ""
        except RuntimeError as e:
            errors[drop] = str(e)
    return errors


if __name__ == "__main__":
    main()
