"""Run under torchrun by test_ulysses.py: Ulysses sequence parallelism over every rank (sp = world size) against
the same model run whole on each rank (sp=1), for padded, causal, packed and shared-prompt rows, with gradient
checkpointing and with eager attention; and the exchanges themselves, exact in float32 and bfloat16.

torchrun --nproc-per-node 4 tests/distributed/ulysses_worker.py <out.json> <model_dir> [<model_dir> ...]

On CPU in float32 by default; TORCHRL_POST_TEST_DEVICE=cuda runs the ranks on the GPU (gloo still: one GPU can
host both ranks), TORCHRL_POST_TEST_DTYPES=float32,bfloat16 runs the models in each dtype (tests/distributed/
device.py; a bfloat16 run's keys start with `bf16_`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.models.qwen2 import modeling_qwen2

from tests.distributed.device import key_prefix, worker_dtypes, worker_env
from tests.distributed.reward_model_checks import reward_model_parity
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.distributed.ulysses import heads_to_seq, seq_to_heads, sum_over
from torchrl_post.multimodal.vision import model_inputs
from torchrl_post.types import Batch
from torchrl_post.workers.logprobs import logits_to_logprobs
from torchrl_post.workers.packing import pack
from torchrl_post.workers.ulysses import ATTENTION, SequenceShard, own_attention, sequence_parallel

P, R = 6, 7  # prompt and response widths: 13 columns, odd, so every sp > 1 pads the rows


def _batch() -> Batch:
    """Four rows: one full; left-padded prompts; short (right-padded) responses; rows 1 and 2 share their prompt.
    Packed they make rows of 13 columns, one of them two samples after a column of slack."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (4, P + R), generator=gen)
    attn = torch.ones_like(ids)
    attn[1, :2] = 0
    attn[1, P + 4 :] = 0
    attn[2, :2] = 0
    attn[2, P + 2 :] = 0
    ids[2, :P] = ids[1, :P]
    attn[3, :2] = 0
    attn[3, P + 2 :] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    n = ids.shape[0]
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=pos,
        loss_mask=attn[:, P:].float(),
        rollout_log_probs=torch.zeros(n, R),
        group_ids=torch.arange(n),
        termination=torch.zeros(n, dtype=torch.long),
        weights=torch.ones(n),
    )


Targets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # row, column (the predicting one), label: [N] each


def _next_tokens(ids: torch.Tensor, valid: torch.Tensor) -> Targets:
    """Every column t < T-1 where `valid` holds at t and t+1, predicting the token at t+1."""
    both = valid[:, :-1] & valid[:, 1:]
    rows, cols = both.nonzero(as_tuple=True)
    return rows, cols, ids[rows, cols + 1]


def _cases(device: torch.device) -> dict[str, tuple[dict[str, Any], Targets]]:
    batch = _batch()
    t = batch.input_ids.shape[1]
    padded = model_inputs(batch, slice(None), 0, t, device)
    ids = batch.input_ids
    causal = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(t).expand(4, -1)}
    causal = {k: v.to(device) for k, v in causal.items()}
    packed = pack(batch, slice(None), shared=False)
    shared = pack(batch, slice(None), shared=True)
    assert packed.segment is None and shared.segment is not None and packed.ids.shape[1] == t
    assert packed.ids.shape[0] < ids.shape[0], "some packed row holds two samples"
    cases = {
        "padded": (padded, _next_tokens(ids, batch.attention_mask.bool())),
        "causal": (causal, _next_tokens(ids, torch.ones_like(ids, dtype=torch.bool))),
        "packed": (packed.inputs(device), (packed.out_row, packed.out_col, packed.labels)),
        "shared": (shared.inputs(device), (shared.out_row, shared.out_col, shared.labels)),
        # what eager is given: the same mask, additive
        "shared_additive": (shared.inputs(device, "eager"), (shared.out_row, shared.out_col, shared.labels)),
    }
    return {name: (inputs, _on(targets, device)) for name, (inputs, targets) in cases.items()}


def _on(targets: Targets, device: torch.device) -> Targets:
    rows, cols, labels = targets
    return rows.to(device), cols.to(device), labels.to(device)


MASKS_BUILT = [0]


def _counting(build: Any) -> Any:
    """transformers' mask builder, counting its calls (the sharded forward must build no mask for the shard)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        MASKS_BUILT[0] += 1
        return build(*args, **kwargs)

    return wrapped


def _run(model: torch.nn.Module, shard: SequenceShard, inputs: dict[str, Any], targets: Targets) -> dict[str, Any]:
    """One forward and backward on this rank's shard: log p and entropy of every target [N] (each rank fills its
    own columns', `sum_over` assembles them), loss = sum of log p, and this rank's parameter gradients."""
    rows, cols, labels = targets
    model.zero_grad(set_to_none=True)
    built = MASKS_BUILT[0]
    with sequence_parallel(model, shard, inputs) as local:
        logits = model(**local).logits  # [b, s_local, V]: columns start:end of the padded rows
        start, end = shard.span(inputs["input_ids"].shape[1])
        mine = ((cols >= start) & (cols < end)).nonzero().squeeze(-1)
        lp, ent = logits_to_logprobs(logits[rows[mine], cols[mine] - start], labels[mine], 1.0)
        zeros = torch.zeros(rows.shape[0], device=rows.device)
        logp = sum_over(zeros.index_put((mine,), lp), shard.group)
        entropy = sum_over(zeros.index_put((mine,), ent.detach()), shard.group)
        loss = logp.sum()
        loss.backward()  # inside the block: a checkpointed layer recomputes its attention here
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"logp": logp.detach(), "entropy": entropy, "loss": loss.detach(), "grads": grads, "local_targets": len(mine),
            "masks_built": MASKS_BUILT[0] - built}  # fmt: skip


def _compare(whole: dict[str, Any], split: dict[str, Any], group: dist.ProcessGroup, sp: int) -> dict[str, Any]:
    """Differences of the sp run from the whole run. Gradients: each rank's loss share gets gradient sp from
    sum_over's backward (every rank seeds 1 on the same summed loss), so the ranks' gradients sum to sp times the
    whole model's: their mean over the group is compared (FSDP's mean over dp x sp ranks divides it out alike).
    A bfloat16 model's gradients are summed and compared in float32."""
    grad_abs, grad_rel = 0.0, 0.0
    assert whole["grads"].keys() == split["grads"].keys() and len(whole["grads"]) > 0
    for name, g1 in whole["grads"].items():
        g1 = g1.float()
        g = split["grads"][name].float().clone()
        dist.all_reduce(g, group=group)
        diff = (g / sp - g1).abs().max().item()
        grad_abs = max(grad_abs, diff)
        grad_rel = max(grad_rel, diff / max(g1.abs().max().item(), 1e-30))
    local = torch.tensor([split["local_targets"]])
    counts = [torch.zeros_like(local) for _ in range(sp)]
    dist.all_gather(counts, local, group=group)
    return {
        "logp_abs": (split["logp"] - whole["logp"]).abs().max().item(),
        "entropy_abs": (split["entropy"] - whole["entropy"]).abs().max().item(),
        "loss_rel": abs(split["loss"].item() / whole["loss"].item() - 1),
        "grad_abs": grad_abs,
        "grad_rel": grad_rel,
        "grad_norm": sum(g.float().square().sum() for g in whole["grads"].values()).sqrt().item(),
        "targets": int(whole["logp"].numel()),
        "targets_per_rank": [int(c) for c in counts],
        "logp_finite": bool(torch.isfinite(split["logp"]).all()),
        "masks_built": [whole["masks_built"], split["masks_built"]],
    }


def _exchange_checks(group: dist.ProcessGroup, rank: int, sp: int, device: torch.device) -> dict[str, bool]:
    """seq_to_heads / heads_to_seq of a shard of a known [b, H, S, d] tensor: exactly the head block over the whole
    sequence and back, in float32 and bfloat16; the backward of each is the other (gradients exact too)."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(1)
        full = torch.randn(2, 4 * sp, 3 * sp, 5, generator=gen).to(device=device, dtype=dtype)
        weight = torch.randn(full.shape, generator=gen).to(device=device, dtype=dtype)
        seq = slice(rank * 3, (rank + 1) * 3)
        heads = slice(rank * 4, (rank + 1) * 4)
        x = full[:, :, seq].clone().requires_grad_(True)
        y = seq_to_heads(x, group)
        (y * weight[:, heads]).sum().backward()
        back = heads_to_seq(y.detach(), group)
        assert x.grad is not None
        name = str(dtype).removeprefix("torch.")
        out[f"seq_to_heads_exact_{name}"] = torch.equal(y, full[:, heads])
        out[f"heads_to_seq_exact_{name}"] = torch.equal(back, full[:, :, seq])
        out[f"backward_exact_{name}"] = torch.equal(x.grad, weight[:, :, seq])
    return out


def _backward_after_block(model: torch.nn.Module, shard: SequenceShard, inputs: dict[str, Any]) -> str:
    """A checkpointed model's backward outside the block (as the actor runs it: the loss after the forward): the
    recomputed attention is still `ulysses` and finds the plan in its saved inputs."""
    model.set_attn_implementation("sdpa")
    model.gradient_checkpointing_enable()
    model.train()
    with sequence_parallel(model, shard, inputs) as local:
        loss = sum_over(model(**local).logits.float().logsumexp(-1).sum(), shard.group)
    try:
        loss.backward()
    except TypeError as e:
        return str(e)
    finally:
        model.gradient_checkpointing_disable()
        model.eval()
    return "no error"


def main() -> None:
    out_path, *model_dirs = sys.argv[1:]
    env = worker_env()
    init_world(env)
    device = env.device
    group = dist.group.WORLD
    assert group is not None
    shard, whole = SequenceShard.of(group), SequenceShard.of(None)
    report: dict[str, Any] = {"sp": shard.size, **_exchange_checks(group, shard.rank, shard.size, device)}
    report |= {"device": str(device), "backend": env.backend, "dtypes": worker_dtypes()}
    cases = _cases(device)
    modeling_qwen2.create_causal_mask = _counting(modeling_qwen2.create_causal_mask)
    started = time.perf_counter()
    for dtype, model_dir in ((d, m) for d in worker_dtypes() for m in model_dirs):
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, attn_implementation="sdpa", dtype=getattr(torch, dtype)
        ).to(device)
        kv, pre = model.config.num_key_value_heads, key_prefix(dtype)
        runs = [(name, name, "sdpa", False) for name in ("padded", "causal", "packed", "shared")]
        runs += [("padded_checkpointed", "padded", "sdpa", True), ("packed_checkpointed", "packed", "sdpa", True)]
        runs += [("padded_eager", "padded", "eager", False), ("shared_eager", "shared_additive", "eager", False)]
        for label, case, impl, checkpointed in runs:
            model.set_attn_implementation(impl)
            if checkpointed:
                model.gradient_checkpointing_enable()
                model.train()  # transformers checkpoints only in training mode (attention dropout is 0)
            inputs, targets = cases[case]
            whole_run, split_run = (_run(model, s, inputs, targets) for s in (whole, shard))
            result = _compare(whole_run, split_run, group, shard.size)
            # the switch stays (a checkpointed backward after the block recomputes through it), the model's own kept
            result["restored"] = model.config._attn_implementation == ATTENTION and own_attention(model) == impl
            report[f"{pre}kv{kv}_{label}"] = result
            model.gradient_checkpointing_disable()
            model.eval()
        report[f"{pre}kv{kv}_backward_after_block"] = _backward_after_block(model, shard, cases["padded"][0])
    report["seconds"] = time.perf_counter() - started
    if shard.size == 4 and device.type == "cpu":  # the sharded reward model on 4 ranks (1 and 2: fsdp_worker.py)
        cfg = Config()
        cfg.model.path = model_dirs[0]
        rm = reward_model_parity(cfg, fsdp_mesh("cpu", env.world_size, -1), env.rank, env.world_size)
        diff = torch.tensor(float(rm["rm_max_diff"]))  # type: ignore[arg-type]
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        report |= {"rm_max_diff_4": float(diff), "rm_sharded_4": rm["rm_sharded"]}
    if shard.rank == 0:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)
    dist.barrier()
    end_process()


if __name__ == "__main__":
    main()
