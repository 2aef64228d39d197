"""Run under torchrun by test_sequence_parallel.py: the actor, critic and reference with Ulysses sequence
parallelism against the same ranks without it (FSDP over all of them, each rank its own rows).

Every rank draws its own rows, as it does in a run. Without sp each rank trains its rows and FSDP averages;
with sp the ranks of a group train the union of their rows, each on 1/sp of every row's tokens. Both must give
the same logprobs of each rank's rows, the same metrics (entropy, policy loss, gradient norm) and the same
weights after an update of two optimizer steps.

torchrun --nproc-per-node N tests/distributed/sp_worker.py <model_dir> <out.json> [<moe_model_dir>]

With a mixture-of-experts model (2 MoE layers, 4 experts, top-2) the `moe_replay` case also runs: packed with
shared prompts and gradient checkpointing (transformers' Qwen3-MoE drops the attention plan from its mask), the actor and the reference replaying random recorded experts (`Batch.routed_experts`), so each
rank's columns must take their own rows of the record.

On CPU in float32 by default; TORCHRL_POST_TEST_DEVICE=cuda runs the ranks on the GPU (gloo still: one GPU can
host both ranks), TORCHRL_POST_TEST_DTYPES=float32,bfloat16 runs every case with the roles' FSDP compute in each
dtype (actor.fsdp.param_dtype and critic.fsdp.param_dtype; float32 master weights; tests/distributed/device.py;
a bfloat16 run's keys start with `bf16_`).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any

import torch

from tests.distributed.checks import make_actor
from tests.distributed.device import key_prefix, worker_dtypes, worker_env, write_reports
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import init_world
from torchrl_post.distributed.placement import fsdp_mesh, sequence_mesh
from torchrl_post.sync.weights import iter_full_weights
from torchrl_post.types import Batch
from torchrl_post.workers.actor import Actor
from torchrl_post.workers.critic import Critic
from torchrl_post.workers.reference import Reference

TOP_K = 4
_KEEP: list[Any] = []  # freed at exit, not while another rank still runs collectives
METRICS = ("actor/entropy", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "actor/pg_clipfrac")
DISTILL_METRICS = ("distill/loss", "distill/student_mass", "distill/teacher_mass")


def _batch(rank: int, rows: int = 4) -> Batch:
    """This rank's rows: varied prompt and response lengths (odd widths, so shards need padding; the ranks' widths
    differ, as trimmed batches do), a prompt shared by two samples (packing shares it), a filtered sample."""
    width, resp = 19 + rank % 2, 7 + rank % 2
    gen = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(5, 100, (rows, width), generator=gen)
    ids[1, : width - resp] = ids[0, : width - resp]  # rows 0 and 1: one prompt, two samples
    attn = torch.ones_like(ids)
    attn[2, :4] = 0  # a left-padded prompt
    attn[1, -3:] = 0  # short responses
    attn[3, -5:] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    mask = attn[:, -resp:].float()
    mask[3, :] = 0 if rank == 0 else mask[3, :]  # a filtered sample on rank 0
    adv = torch.randn(rows, 1, generator=gen) * mask
    old = -torch.rand(rows, resp, generator=gen) * mask
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=pos,
        loss_mask=mask,
        rollout_log_probs=old.clone(),
        group_ids=torch.tensor([0, 0, 1, 2]) + 10 * rank,
        termination=torch.zeros(rows, dtype=torch.long),
        weights=torch.ones(rows),
        advantages=adv,
        old_log_probs=old,
    )


def _routes(batch: Batch, rank: int, layers: int = 2) -> Batch:
    """`batch` with random recorded experts (2 distinct of 4 per token and layer; one record for a shared prompt)."""
    gen = torch.Generator().manual_seed(200 + rank)
    n, width = batch.input_ids.shape
    first = torch.randint(0, 4, (n, layers, 1, width), generator=gen)
    routes = torch.cat([first, (first + torch.randint(1, 4, first.shape, generator=gen)) % 4], 2).to(torch.int16)
    routes[1, :, :, : batch.prompt_width] = routes[0, :, :, : batch.prompt_width]  # rows 0, 1: one prompt
    routes[batch.attention_mask[:, None, None, :].expand_as(routes) == 0] = -1
    return dataclasses.replace(batch, routed_experts=routes)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(iter_full_weights(model, 1 << 20))


def _real_diff(a: torch.Tensor, b: torch.Tensor, batch: Batch) -> float:
    """The largest difference at real response tokens (a padded forward leaves garbage after a short response);
    [B, R, ...] results (a teacher's top-k) at every entry of those tokens."""
    mask = batch.response_mask.view(*batch.response_mask.shape, *(1,) * (a.dim() - 2))
    return ((a - b).abs() * mask).max().item()


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _actor_run(cfg: Config, fsdp: Any, seq: Any, batch: Batch, device: torch.device) -> dict[str, Any]:
    torch.manual_seed(0)
    actor = Actor(
        cfg.model, cfg.actor, fsdp, device, temperature=1.0, mini_batch_samples=2, micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu,
        max_response_length=cfg.data.max_response_length, total_steps=1, sequence=seq,
        replay=batch.routed_experts is not None,
        distill=cfg.distillation if cfg.distillation.enable else None,
    )  # fmt: skip
    _KEEP.append(actor)
    logp = actor.log_probs(batch).cpu()
    metrics = actor.update(batch)
    names = METRICS + (DISTILL_METRICS if cfg.distillation.enable else ())
    return {"logp": logp, "metrics": {k: metrics[k] for k in names}, "weights": _weights(actor.model)}


def _critic_run(cfg: Config, fsdp: Any, seq: Any, batch: Batch, device: torch.device) -> dict[str, Any]:
    torch.manual_seed(0)
    critic = Critic(
        cfg.model, cfg.critic, fsdp, device, mini_batch_samples=2, micro_batch_samples=cfg.critic.ppo_micro_batch_size_per_gpu, epochs=1,
        max_response_length=cfg.data.max_response_length, total_steps=1, sequence=seq,
    )  # fmt: skip
    _KEEP.append(critic)
    values = critic.values(batch).cpu()
    returns = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(7)) * batch.loss_mask
    metrics = critic.update(dataclasses.replace(batch, values=values, returns=returns))
    return {"values": values, "grad_norm": metrics["critic/grad_norm"], "weights": _weights(critic.model)}


def _reference_run(
    cfg: Config, fsdp: Any, seq: Any, batch: Batch, device: torch.device, top_k: int = 0, temperature: float = 1.0
) -> torch.Tensor:
    """Reference logprobs [B, R]; with `top_k`, a distillation teacher's answer: its top-k [B, R, k, 2]."""
    ref = Reference(
        cfg.model, cfg.reference, cfg.actor.fsdp, fsdp, device, temperature=temperature, sequence=seq,
        replay=batch.routed_experts is not None, top_k=top_k,
    )  # fmt: skip
    _KEEP.append(ref)
    return ref.log_probs(batch).cpu()


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    env = worker_env()
    init_world(env)
    world, rank, device = env.world_size, env.rank, env.device
    report: dict[str, Any] = {"device": str(device), "backend": env.backend, "dtypes": worker_dtypes()}
    layouts = [sp for sp in (2, 4) if world % sp == 0]
    cases = (
        ("padded", False, False, False),
        ("packed", True, False, False),
        ("shared", True, True, False),
        ("checkpointing", True, True, True),
        ("lora", True, True, False),
        ("dynamic", True, True, False),
    ) + ((("moe_replay", True, True, True),) if len(sys.argv) > 3 else ())
    for dtype, (case, packed, shared, ckpt) in ((d, c) for d in worker_dtypes() for c in cases):
        name = f"{key_prefix(dtype)}{case}"
        moe = case == "moe_replay"
        batch = _routes(_batch(rank), rank) if moe else _batch(rank)
        cfg = Config()
        cfg.actor.fsdp.param_dtype = cfg.critic.fsdp.param_dtype = dtype
        cfg.model.path = sys.argv[3] if moe else model_dir
        cfg.model.use_remove_padding, cfg.model.use_shared_prefix = packed, shared
        cfg.model.enable_gradient_checkpointing = ckpt
        cfg.model.lora_rank = 4 if case == "lora" else 0  # PEFT wraps the model: its attention switches alike
        # token-budget micro-batches: the budget is per rank, so an sp group's micro-batch holds sp times the rows
        cfg.actor.use_dynamic_bsz, cfg.actor.ppo_max_token_len_per_gpu = case == "dynamic", 30
        cfg.data.max_response_length = 8
        cfg.actor.ppo_micro_batch_size_per_gpu = 2 if case != "checkpointing" else 4
        cfg.actor.clip_ratio = 0.1  # ratios off 1 (old logprobs are random): clipping counts
        cfg.actor.lr = cfg.critic.lr = 1e-3
        fsdp = fsdp_mesh(device.type, world, -1)
        base = _actor_run(cfg, fsdp, None, batch, device)
        for sp in layouts:
            got = _actor_run(cfg, fsdp, sequence_mesh(device.type, world, sp), batch, device)
            key = f"{name}_sp{sp}"
            report[f"{key}_logp_diff"] = _real_diff(got["logp"], base["logp"], batch)
            report[f"{key}_metrics"] = [got["metrics"], base["metrics"]]
            report[f"{key}_weights_diff"] = _max_diff(got["weights"], base["weights"])
        if moe:  # the reference replays too (the critic has no use for routes)
            ref = _reference_run(cfg, fsdp, None, batch, device)
            plain = _reference_run(cfg, fsdp, None, dataclasses.replace(batch, routed_experts=None), device)
            report[f"{name}_replay_moved"] = _real_diff(plain, ref, batch)  # the record is not the routers' choice
            for sp in layouts:
                got_r = _reference_run(cfg, fsdp, sequence_mesh(device.type, world, sp), batch, device)
                report[f"{name}_sp{sp}_reference_diff"] = _real_diff(got_r, ref, batch)
        if case in ("padded", "shared"):
            crit = _critic_run(cfg, fsdp, None, batch, device)
            ref = _reference_run(cfg, fsdp, None, batch, device)
            for sp in layouts:
                mesh = sequence_mesh(device.type, world, sp)
                got_c = _critic_run(cfg, fsdp, mesh, batch, device)
                key = f"{name}_sp{sp}"
                report[f"{key}_values_diff"] = (got_c["values"] - crit["values"]).abs().max().item()
                report[f"{key}_critic_grad_norm"] = [got_c["grad_norm"], crit["grad_norm"]]
                report[f"{key}_critic_weights_diff"] = _max_diff(got_c["weights"], crit["weights"])
                report[f"{key}_reference_diff"] = _real_diff(_reference_run(cfg, fsdp, mesh, batch, device), ref, batch)
            # distillation's forward_kl_topk: a teacher's top-k (the same model at temperature 0.5, so it differs
            # from the student) and the student's supervised forward KL over those ids, with and without sp
            topk = _reference_run(cfg, fsdp, None, batch, device, top_k=TOP_K, temperature=0.5)
            dcfg = copy.deepcopy(cfg)
            d = dcfg.distillation
            d.enable, d.loss_mode, d.topk, d.use_policy_gradient, d.use_task_rewards = (
                True, "forward_kl_topk", TOP_K, False, False,
            )  # fmt: skip
            dbatch = dataclasses.replace(batch, teacher_topk=topk)
            distilled = _actor_run(dcfg, fsdp, None, dbatch, device)
            report[f"{name}_distill_moved"] = _max_diff(distilled["weights"], base["weights"])
            for sp in layouts:
                mesh = sequence_mesh(device.type, world, sp)
                key = f"{name}_sp{sp}"
                got_t = _reference_run(cfg, fsdp, mesh, batch, device, top_k=TOP_K, temperature=0.5)
                report[f"{key}_topk_diff"] = _real_diff(got_t, topk, batch)  # log p and ids (exact in float32)
                got_d = _actor_run(dcfg, fsdp, mesh, dbatch, device)
                report[f"{key}_distill_metrics"] = [got_d["metrics"], distilled["metrics"]]
                report[f"{key}_distill_weights_diff"] = _max_diff(got_d["weights"], distilled["weights"])
        report[f"{name}_moved"] = _max_diff(base["weights"], _weights(make_actor(cfg, fsdp, device=device).model))
    write_reports(report, out)


if __name__ == "__main__":
    main()
