"""Run under torchrun by test_fsdp.py: bucketed gather of uneven FSDP2 shards, and update equivalences; with
`options`, the FSDP2 options (offload_policy, reshard_after_forward, reference.param_offload, model.dtype).

torchrun --nproc-per-node 2 tests/distributed/fsdp_worker.py <odd_model_dir> <out.json> [options]
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from tests.distributed.checks import make_actor
from tests.distributed.reward_model_checks import reward_model_parity
from torchrl_post.algos.policy_loss import LOSS_AGG_MODES
from torchrl_post.algos.rollout_correction import RolloutCorrection
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.sync.weights import iter_full_weights
from torchrl_post.types import Batch
from torchrl_post.workers.actor import Actor
from torchrl_post.workers.critic import Critic
from torchrl_post.workers.reference import Reference

_KEEP: list[Actor | Critic | Reference] = []


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


def _offloaded(model: torch.nn.Module) -> list[bool]:
    """For every FSDP2 parameter: whether its module runs under CPUOffloadPolicy."""
    return [
        fp.offload_to_cpu
        for m in model.modules()
        if isinstance(m, FSDPModule)
        for group in m._get_fsdp_state()._fsdp_param_groups
        for fp in group.fsdp_params
    ]


def _sharded(model: torch.nn.Module) -> bool:
    """Whether every parameter is its DTensor shard (none left gathered by a forward)."""
    return all(isinstance(p, DTensor) for p in model.parameters())


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _critic(cfg: Config, mesh: DeviceMesh, batch: Batch, mini: int) -> tuple[Critic, dict[str, torch.Tensor], float]:
    """A critic after one update of two optimizer steps: (critic, its weights, seconds the update took)."""
    torch.manual_seed(0)
    critic = Critic(
        cfg.model,
        cfg.critic,
        mesh,
        torch.device("cpu"),
        mini_batch_samples=mini,
        micro_batch_samples=cfg.critic.ppo_micro_batch_size_per_gpu,
        epochs=1,
        max_response_length=5,
        total_steps=1,
    )
    _KEEP.append(critic)
    start = time.perf_counter()
    metrics = critic.update(batch)
    took = time.perf_counter() - start
    weights = dict(iter_full_weights(critic.model, 1 << 20))
    return critic, {**weights, "grad_norm": torch.tensor(metrics["critic/grad_norm"])}, took


def _actor(cfg: Config, mesh: DeviceMesh, batch: Batch, mini: int) -> tuple[Actor, dict[str, torch.Tensor], float]:
    """An actor after one update of two optimizer steps: (actor, its weights, seconds the update took)."""
    torch.manual_seed(0)
    actor = make_actor(cfg, mesh, mini)
    _KEEP.append(actor)
    start = time.perf_counter()
    metrics = actor.update(batch)
    took = time.perf_counter() - start
    weights = dict(iter_full_weights(actor.model, 1 << 20))
    return actor, {**weights, "grad_norm": torch.tensor(metrics["actor/grad_norm"])}, took


def _dtypes(model: torch.nn.Module, trainable: bool | None = None) -> list[str]:
    return sorted({str(p.dtype) for p in model.parameters() if trainable is None or p.requires_grad == trainable})


def options(cfg: Config, mesh: DeviceMesh, rank: int, world: int) -> dict[str, object]:
    """The FSDP2 options: each gives the update it gives without it, and does what it says."""
    report: dict[str, object] = {}
    times: dict[str, float] = {}
    gen = torch.Generator().manual_seed(0)
    full = _batch(gen)
    per = len(full) // world
    half = full.select(slice(rank * per, rank * per + per))
    mini = per // 2  # two optimizer steps per update: the second steps from the (offloaded) optimizer state
    cfg.actor.grad_clip = cfg.critic.grad_clip = 0.05  # below the gradient norms: clipping scales offloaded grads
    ckpt = load_file(f"{cfg.model.path}/model.safetensors")

    # 1. actor.fsdp.offload_policy: the policy on every parameter, the same weights after two steps. Each run
    #    twice: the second's time is the warm one.
    runs: dict[bool, dict[str, torch.Tensor]] = {}
    for offload in (False, True, False, True):
        cfg.actor.fsdp.offload_policy = offload
        actor, runs[offload], times[f"actor_offload_{offload}"] = _actor(cfg, mesh, half, mini)
        report[f"actor_policy_{offload}"] = sorted(set(_offloaded(actor.model)))
        states = [v for st in actor.optimizer.state.values() for v in st.values() if isinstance(v, DTensor)]
        report[f"actor_optimizer_state_on_cpu_{offload}"] = bool(states) and all(
            v.to_local().device.type == "cpu" for v in states
        )
    cfg.actor.fsdp.offload_policy = False
    report["actor_offload_max_diff"] = _max_diff(runs[False], runs[True])
    report["actor_grad_norms"] = [runs[False]["grad_norm"].item(), runs[True]["grad_norm"].item()]
    report["actor_moved"] = _max_diff(ckpt, runs[True])

    # 2. critic.fsdp.offload_policy: the same; no-grad values leave nothing gathered.
    values = torch.zeros_like(half.loss_mask)
    returns = torch.randn(half.loss_mask.shape, generator=torch.Generator().manual_seed(rank)) * half.loss_mask
    cb = dataclasses.replace(half, values=values, returns=returns)
    critic_runs = {}
    for offload in (False, True, False, True):
        cfg.critic.fsdp.offload_policy = offload
        critic, critic_runs[offload], times[f"critic_offload_{offload}"] = _critic(cfg, mesh, cb, mini)
        report[f"critic_policy_{offload}"] = sorted(set(_offloaded(critic.model)))
        critic.values(cb)
        report[f"critic_sharded_after_values_{offload}"] = _sharded(critic.model)
    cfg.critic.fsdp.offload_policy = False
    report["critic_offload_max_diff"] = _max_diff(critic_runs[False], critic_runs[True])
    report["critic_grad_norms"] = [critic_runs[False]["grad_norm"].item(), critic_runs[True]["grad_norm"].item()]
    report["update_seconds"] = times

    # 3. actor.fsdp.reshard_after_forward=false (ZeRO-2): the same update; no-grad logprobs leave nothing
    #    gathered (with true too: the root keeps its parameters after forward).
    for raf in (True, False):
        cfg.actor.fsdp.reshard_after_forward = raf
        torch.manual_seed(0)
        actor = make_actor(cfg, mesh, mini)
        _KEEP.append(actor)
        lp = actor.log_probs(half)
        report[f"actor_sharded_after_log_probs_{raf}"] = _sharded(actor.model)
        if not raf:
            metrics = actor.update(half)
            w = dict(iter_full_weights(actor.model, 1 << 20))
            report["actor_zero2_max_diff"] = _max_diff(
                runs[False], {**w, "grad_norm": torch.tensor(metrics["actor/grad_norm"])}
            )

    # 4. The reference (reusing actor.fsdp, here reshard_after_forward=false) reshards after every forward;
    #    reference.param_offload runs the policy (and actor.fsdp.offload_policy does not reach it); its logprobs
    #    are the initial actor's.
    cfg.actor.fsdp.offload_policy = True
    ref_lp = {}
    for offload in (False, True):
        cfg.reference.param_offload = offload
        ref = Reference(cfg.model, cfg.reference, cfg.actor.fsdp, mesh, torch.device("cpu"), temperature=1.0)
        _KEEP.append(ref)
        ref_lp[offload] = ref.log_probs(half)
        report[f"reference_policy_{offload}"] = sorted(set(_offloaded(ref.model)))
        report[f"reference_sharded_after_forward_{offload}"] = _sharded(ref.model)
    cfg.reference.param_offload = cfg.actor.fsdp.offload_policy = False
    cfg.actor.fsdp.reshard_after_forward = True
    report["reference_offload_logprob_diff"] = (ref_lp[False] - ref_lp[True]).abs().max().item()
    report["reference_vs_actor_logprob_diff"] = (ref_lp[False] - lp).abs().max().item()

    # 5. model.dtype: every role's parameters in it; the update runs with and without offload, alike.
    cfg.model.dtype = "bfloat16"
    bf16: dict[bool, dict[str, torch.Tensor]] = {}
    for offload in (False, True):
        cfg.actor.fsdp.offload_policy = offload
        actor, bf16[offload], _ = _actor(cfg, mesh, half, mini)
        report[f"bf16_actor_dtypes_{offload}"] = _dtypes(actor.model)
        report[f"bf16_actor_grad_norm_{offload}"] = bf16[offload]["grad_norm"].item()
    cfg.actor.fsdp.offload_policy = False
    report["bf16_actor_moved"] = _max_diff(ckpt, bf16[False])
    report["bf16_actor_offload_max_diff"] = _max_diff(bf16[False], bf16[True])
    ref = Reference(cfg.model, cfg.reference, cfg.actor.fsdp, mesh, torch.device("cpu"), temperature=1.0)
    _KEEP.append(ref)
    report["bf16_reference_dtypes"] = _dtypes(ref.model)
    critic, _, _ = _critic(cfg, mesh, cb, mini)
    report["bf16_critic_dtypes"] = _dtypes(critic.model)
    # LoRA on a bfloat16 base: PEFT keeps the adapter (all that trains) in float32.
    cfg.model.lora_rank = 4
    actor, lora, _ = _actor(cfg, mesh, half, mini)
    report["bf16_lora_dtypes"] = [_dtypes(actor.model, trainable=False), _dtypes(actor.model, trainable=True)]
    report["bf16_lora_grad_norm"] = lora["grad_norm"].item()
    cfg.model.lora_rank, cfg.model.dtype = 0, "float32"
    return report


def _ragged(rank: int, world: int, rows: int = 4, prompt: int = 9, resp: int = 6) -> Batch:
    """This rank's rows of a batch whose first rank has full-length samples and the others short ones: their
    token-budget micro-batch counts differ, as on real ranks. Rows come in pairs that share a prompt (GRPO's
    samples of one prompt)."""
    gen = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(5, 100, (rows, prompt + resp), generator=gen)
    ids[1::2, :prompt] = ids[0::2, :prompt]
    attn = torch.ones_like(ids)
    if rank > 0:
        for i in range(rows):
            attn[i, : 4 + 2 * ((i // 2) % 2)] = 0
            attn[i, prompt + 1 + 3 * (i % 2) :] = 0
    mask = attn[:, -resp:].float()
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        loss_mask=mask,
        rollout_log_probs=torch.zeros(rows, resp),
        group_ids=torch.arange(rows) + rank * rows,
        termination=torch.zeros(rows, dtype=torch.long),
        weights=torch.ones(rows),
        advantages=torch.randn(rows, 1, generator=gen) * mask,
        values=torch.zeros(rows, resp),
        returns=torch.randn(rows, resp, generator=gen) * mask,
    )


def packing(cfg: Config, mesh: DeviceMesh, rank: int, world: int) -> dict[str, object]:
    """model.use_remove_padding: the padded update's weights, gradient norm and logprobs, with fixed and
    token-budget micro-batches whose counts differ between ranks (stand-ins keep FSDP's collectives paired)."""
    batch = _ragged(rank, world)
    out: dict[str, object] = {}
    runs: dict[str, dict[str, torch.Tensor]] = {}
    logps: dict[str, torch.Tensor] = {}
    for name, packed, dynamic in (
        ("padded", False, False),
        ("packed", True, False),
        ("packed_dynamic", True, True),
        ("padded_dynamic", False, True),
        ("packed_apart", True, False),  # model.use_shared_prefix=false: each sample with its own prompt
    ):
        cfg.model.use_remove_padding, cfg.actor.use_dynamic_bsz = packed, dynamic
        cfg.model.use_shared_prefix = name != "packed_apart"
        cfg.actor.ppo_max_token_len_per_gpu = 16  # full rows alone on rank 0, 2-3 short rows together elsewhere
        torch.manual_seed(0)
        actor = make_actor(cfg, mesh, 2)  # two optimizer steps
        _KEEP.append(actor)
        logps[name] = actor.log_probs(batch)
        metrics = actor.update(batch)
        runs[name] = {
            **dict(iter_full_weights(actor.model, 1 << 20)),
            "grad_norm": torch.tensor(metrics["actor/grad_norm"]),
        }
        out[f"padding_frac_{name}"] = metrics["perf/padding_frac"]
        out[f"shared_prompt_frac_{name}"] = metrics["perf/shared_prompt_frac"]
        out[f"pg_loss_{name}"] = metrics["actor/pg_loss"]
        out[f"entropy_{name}"] = metrics["actor/entropy"]
    for name in runs:
        out[f"pack_max_diff_{name}"] = _max_diff(runs["padded"], runs[name])
        out[f"pack_grad_norm_{name}"] = runs[name]["grad_norm"].item()
        out[f"pack_logp_diff_{name}"] = ((logps[name] - logps["padded"]) * batch.loss_mask).abs().max().item()
    out["pack_moved"] = _max_diff(load_file(f"{cfg.model.path}/model.safetensors"), runs["padded"])
    critic_runs = {}
    for packed in (False, True):
        cfg.model.use_remove_padding = packed
        critic, critic_runs[packed], _ = _critic(cfg, mesh, batch, 2)
        out[f"critic_values_{packed}"] = critic.values(batch).tolist()
    out["critic_pack_max_diff"] = _max_diff(critic_runs[False], critic_runs[True])
    cfg.model.use_remove_padding, cfg.actor.use_dynamic_bsz = False, False
    return out


def corrections(cfg: Config, mesh: DeviceMesh, half: Batch) -> dict[str, object]:
    """algorithm.rollout_correction through the update, against the same update without it on a batch changed by
    hand: a rejection (token, sequence, geometric; the veto) equals zeroing the rejected tokens' or rows' loss
    mask, and importance weights (token, sequence) equal multiplying the advantages by them (the clipped loss is
    linear in a positive scale of the advantage, dual clip included). The rollout logprobs are the old ones minus
    delta ~ N(0, 0.6) per token; band [0.5, 2] ([0.8, 1.25] for the geometric mean), cap 1.5, veto
    below 0.5. Sums over both ranks."""
    torch.manual_seed(0)
    probe = make_actor(cfg, mesh)
    _KEEP.append(probe)
    old = probe.log_probs(half)  # the policy every update below starts from
    delta = torch.randn(old.shape, generator=torch.Generator().manual_seed(7 + dist.get_rank())) * 0.6
    valid = half.loss_mask > 0
    d = torch.where(valid, delta, 0.0)
    base = dataclasses.replace(
        half, old_log_probs=old, rollout_log_probs=old - delta, advantages=half.advantages.expand_as(old).clone()
    )
    row_sum = d.sum(-1, keepdim=True)
    bands = {"token": (0.5, 2.0), "sequence": (0.5, 2.0), "geometric": (0.8, 1.25)}  # a mean of ~5 varies less

    def outside(x: torch.Tensor, level: str) -> torch.Tensor:
        return (x < math.log(bands[level][0])) | (x > math.log(bands[level][1]))

    rejected = {
        "token": valid & outside(d, "token"),
        "sequence": valid & outside(row_sum, "sequence"),
        "geometric": valid & outside(row_sum / valid.sum(-1, keepdim=True).clamp(min=1), "geometric"),
        "veto": valid & (d < math.log(0.5)).any(-1, keepdim=True),
    }
    weights = {"token": d.exp().clamp(max=1.5), "sequence": row_sum.exp().clamp(max=1.5).expand_as(d)}

    def update(batch: Batch, correction: RolloutCorrection | None) -> tuple[dict[str, torch.Tensor], dict]:
        torch.manual_seed(0)
        actor = make_actor(cfg, mesh, correction=correction)
        _KEEP.append(actor)
        metrics = actor.update(batch)
        return {
            **dict(iter_full_weights(actor.model, 1 << 20)),
            "grad_norm": torch.tensor(metrics["actor/grad_norm"]),
        }, metrics

    def total(x: torch.Tensor) -> float:
        t = x.double().sum().reshape(1)
        dist.all_reduce(t)
        return t.item()

    report: dict[str, object] = {"corr_tokens": total(valid)}
    for level, gone in rejected.items():
        rc = (
            RolloutCorrection(rollout_token_veto_threshold=0.5)
            if level == "veto"
            else RolloutCorrection(
                rollout_rs=level, rollout_rs_threshold=bands[level][1], rollout_rs_threshold_lower=bands[level][0]
            )
        )
        got, metrics = update(base, rc)
        want, _ = update(dataclasses.replace(base, loss_mask=base.loss_mask * ~gone), None)
        report[f"corr_rs_{level}_max_diff"] = _max_diff(got, want)
        report[f"corr_rs_{level}_grad_norms"] = [got["grad_norm"].item(), want["grad_norm"].item()]
        report[f"corr_rs_{level}_rejected"] = [total(gone), total(gone.any(-1))]  # tokens, rows
        key = "rollout_is_veto_fraction" if level == "veto" else "rollout_rs_masked_fraction"
        report[f"corr_rs_{level}_metric"] = metrics[f"rollout_corr/{key}"]
    for level, w in weights.items():
        got, metrics = update(base, RolloutCorrection(rollout_is=level, rollout_is_threshold=1.5))
        want, _ = update(dataclasses.replace(base, advantages=base.advantages * w), None)
        report[f"corr_is_{level}_max_diff"] = _max_diff(got, want)
        report[f"corr_is_{level}_grad_norms"] = [got["grad_norm"].item(), want["grad_norm"].item()]
        report[f"corr_is_{level}_capped"] = total(valid & (w >= 1.5))
        report[f"corr_is_{level}_weight_mean"] = [metrics["rollout_corr/is_weight_mean"], total(w * valid)]
    report["corr_rows"] = total(valid.any(-1))
    return report


def _write(report: dict[str, object], out_path: str, rank: int, world: int) -> None:
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    end_process()


def skipping(cfg: Config, mesh: DeviceMesh, rank: int, world: int) -> dict[str, object]:
    """actor.skip_zero_advantage: the update that skips the rows whose advantages are all 0 against the one that
    computes them, padded and packed (fixed and token-budget micro-batches), two optimizer steps of two rows. On the
    first rank the second mini-batch is all zeros (only stand-ins run there), on the second one row is."""
    batch = _ragged(rank, world)
    assert batch.advantages is not None
    zero = [2, 3] if rank == 0 else [0]
    batch.advantages[zero] = 0.0
    out: dict[str, object] = {"skip_expected": len(zero)}
    for name, packed, dynamic in (("padded", False, False), ("packed", True, False), ("packed_dynamic", True, True)):
        cfg.model.use_remove_padding, cfg.actor.use_dynamic_bsz = packed, dynamic
        cfg.actor.ppo_micro_batch_size_per_gpu = 1  # fixed micro-batches: the ranks' counts differ once rows go
        cfg.actor.ppo_max_token_len_per_gpu = 16
        runs = {}
        for skip in (False, True):
            torch.manual_seed(0)
            actor = make_actor(cfg, mesh, 2, skip_zero_advantage=skip)
            _KEEP.append(actor)
            metrics = actor.update(batch)
            runs[skip] = {
                **dict(iter_full_weights(actor.model, 1 << 20)),
                "grad_norm": torch.tensor(metrics["actor/grad_norm"]),
            }
            out[f"skip_{name}_{skip}_pg_loss"] = metrics["actor/pg_loss"]
            out[f"skip_{name}_{skip}_frac"] = metrics.get("actor/skipped_samples_frac", -1.0)
        out[f"skip_{name}_max_diff"] = _max_diff(runs[False], runs[True])
        out[f"skip_{name}_grad_norms"] = [runs[False]["grad_norm"].item(), runs[True]["grad_norm"].item()]
    cfg.model.use_remove_padding, cfg.actor.use_dynamic_bsz = False, False
    cfg.actor.ppo_micro_batch_size_per_gpu = 32
    return out


def main() -> None:
    model_dir, out_path = sys.argv[1:3]
    env = read_env("cpu")
    init_world(env)
    cfg = Config()
    cfg.model.path = model_dir
    cfg.actor.lr = 1e-2
    mesh = fsdp_mesh("cpu", env.world_size, cfg.actor.fsdp.fsdp_size)
    if sys.argv[3:] == ["options"]:
        _write(options(cfg, mesh, env.rank, env.world_size), out_path, env.rank, env.world_size)
        return
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
    cfg.actor.loss_agg_mode = "token-mean"
    report |= packing(cfg, mesh, env.rank, env.world_size)
    report |= skipping(cfg, mesh, env.rank, env.world_size)
    report |= corrections(cfg, mesh, half)
    report |= reward_model_parity(cfg, mesh, env.rank, env.world_size)
    gathered: list[object] = [None] * env.world_size
    dist.all_gather_object(gathered, report)
    if env.rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
        torch.save(sharded, out_path + ".pt")
    end_process()


if __name__ == "__main__":
    main()
