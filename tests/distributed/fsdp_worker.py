"""Run under torchrun by test_fsdp.py: bucketed gather of uneven FSDP2 shards, and update equivalences.

torchrun --nproc-per-node 2 tests/distributed/fsdp_worker.py <odd_model_dir> <out.json>
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.device_mesh import DeviceMesh

from tests.distributed.checks import make_actor
from torchrl_post.algos.policy_loss import LOSS_AGG_MODES
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import init_world, read_env, shutdown_distributed
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.sync.weights import iter_full_weights
from torchrl_post.types import Batch
from torchrl_post.workers.actor import Actor

_KEEP: list[Actor] = []


def _batch(gen: torch.Generator, rows: int = 8, width: int = 12, resp: int = 5) -> Batch:
    ids = torch.randint(5, 100, (rows, width), generator=gen)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0  # a left-padded prompt
    attn[1, -2:] = 0  # a short response
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    mask = attn[:, -resp:].float()
    mask[3, :] = 0  # a filtered sample: its row leaves every denominator
    adv = torch.randn(rows, 1, generator=gen) * mask
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=pos,
        loss_mask=mask,
        rollout_log_probs=torch.zeros(rows, resp),
        group_ids=torch.arange(rows),
        termination=torch.zeros(rows, dtype=torch.long),
        weights=torch.ones(rows),
        advantages=adv,
    )


def _updated(cfg: Config, mesh: DeviceMesh, batch: Batch, mini: int) -> dict[str, torch.Tensor]:
    """Weights after one update, plus the pre-clip gradient norm (Adam hides loss-scale errors; the norm does not)."""
    torch.manual_seed(0)
    actor = make_actor(cfg, mesh, mini)
    _KEEP.append(actor)  # freed at exit, not mid-run while the other rank still runs collectives
    metrics = actor.update(batch)
    return {**dict(iter_full_weights(actor.model, 1 << 20)), "grad_norm": torch.tensor(metrics["actor/grad_norm"])}


def main() -> None:
    model_dir, out_path = sys.argv[1:3]
    env = read_env("cpu")
    init_world(env)
    cfg = Config()
    cfg.model.path = model_dir
    cfg.actor.lr = 1e-2
    mesh = fsdp_mesh("cpu", env.world_size, cfg.actor.fsdp.fsdp_size)
    report: dict[str, object] = {}

    # 1. Gathered weights equal the checkpoint exactly, whatever the bucket size (odd dims shard unevenly).
    actor = make_actor(cfg, mesh)
    ref = load_file(f"{model_dir}/model.safetensors")
    for bucket in (1, 4096, 1 << 30):
        got = dict(iter_full_weights(actor.model, bucket))
        report[f"gather_exact_{bucket}"] = set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    report["uneven_param"] = any(v.shape[0] % env.world_size for v in ref.values())

    # 2. Each rank updates on its share of one global batch. The test compares the result of 1 and 2 ranks
    #    (token-mean over the global batch makes them equal), and here micro-batching and activation
    #    checkpointing must not change it either.
    gen = torch.Generator().manual_seed(0)
    full = _batch(gen)
    per = len(full) // env.world_size
    half = full.select(slice(env.rank * per, env.rank * per + per))
    sharded = _updated(cfg, mesh, half, mini=per)
    cfg.actor.ppo_micro_batch_size_per_gpu = 1  # gradient accumulation over micro-batches of one sample
    accumulated = _updated(cfg, mesh, half, mini=per)
    report["accumulation_max_diff"] = max((sharded[k] - accumulated[k]).abs().max().item() for k in sharded)
    cfg.actor.ppo_micro_batch_size_per_gpu = 32
    cfg.actor.use_dynamic_bsz, cfg.actor.ppo_max_token_len_per_gpu = True, 20  # 1-2 rows per micro-batch
    dynamic = _updated(cfg, mesh, half, mini=per)
    report["dynamic_bsz_max_diff"] = max((sharded[k] - dynamic[k]).abs().max().item() for k in sharded)
    cfg.actor.use_dynamic_bsz = False
    cfg.model.enable_gradient_checkpointing = True
    checkpointed = _updated(cfg, mesh, half, mini=per)
    report["checkpointing_max_diff"] = max((sharded[k] - checkpointed[k]).abs().max().item() for k in sharded)
    report["grad_norms"] = [
        sharded["grad_norm"].item(),
        accumulated["grad_norm"].item(),
        checkpointed["grad_norm"].item(),
        dynamic["grad_norm"].item(),
    ]
    report["update_moved"] = max((sharded[k] - ref[k]).abs().max().item() for k in ref)
    cfg.model.enable_gradient_checkpointing = False

    # 3. Every loss aggregation mode: the same gradient for any split of the mini-batch (micro-batches of 3
    #    rows, so 4 = 3 + 1 is uneven, and token-budget micro-batches) as for the whole one.
    modes: dict[str, list[float]] = {}
    for mode in LOSS_AGG_MODES:
        cfg.actor.loss_agg_mode = mode
        whole = _updated(cfg, mesh, half, mini=per)
        cfg.actor.ppo_micro_batch_size_per_gpu = 3
        uneven = _updated(cfg, mesh, half, mini=per)
        cfg.actor.ppo_micro_batch_size_per_gpu = 32
        cfg.actor.use_dynamic_bsz = True
        dyn = _updated(cfg, mesh, half, mini=per)
        cfg.actor.use_dynamic_bsz = False
        modes[mode] = [whole["grad_norm"].item(), uneven["grad_norm"].item(), dyn["grad_norm"].item()]
    report["agg_mode_grad_norms"] = modes
    gathered: list[object] = [None] * env.world_size
    dist.all_gather_object(gathered, report)
    if env.rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
        torch.save(sharded, out_path + ".pt")
    shutdown_distributed()


if __name__ == "__main__":
    main()
