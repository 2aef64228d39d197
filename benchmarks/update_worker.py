"""Tokens/s of the project's actor update against a bare PyTorch loop over the same micro-batches, under torchrun.

    torchrun --standalone --nproc-per-node K benchmarks/update_worker.py --model DIR --out FILE \
        [--samples 64 --group 8 --prompt-len 40,120 --response-len 1,64 --lengths uniform|skewed \
         --micro 8 --budget 2048 --modes fixed,dynamic,packed,packed_dynamic --repeats 3]

One seeded GRPO-shaped batch: `samples` rows in groups of `group` sharing a random prompt (left-padded), each
with its own response (right-padded) and an advantage normalized within its group; rank r takes the r-th
contiguous share of the rows, as the trainer does.

"ours" is `Actor.update(batch)` with the keys a user would set per mode (MODES: model.use_remove_padding,
actor.use_dynamic_bsz). "bare" is the plain HF model with torch.optim.AdamW over the same micro-batches (from the
project's planner, computed outside the timing): per micro-batch one forward on the columns some row uses
(padded) or on one row of the rows' real tokens with per-sample position ids (packed), the on-policy PPO surrogate
-(exp(logp - logp.detach()) * adv * mask).sum() / tokens, backward; on K > 1 ranks one all_reduce of the
flattened gradients; gradient clipping; the AdamW step.

Each call is warmed up once; then ours and the bare loops take turns for `repeats` rounds and the median is
reported, of wall seconds and of rank 0's process CPU seconds. Simplifications: one optimizer step per update,
float32, no reference/KL term, on-policy, random weights and tokens. Rank 0 writes one JSON record.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import dp_group, fsdp_mesh
from torchrl_post.types import Batch
from torchrl_post.workers.actor import Actor
from torchrl_post.workers.micro_batches import plan_micro_batches

MODES = ("fixed", "dynamic", "packed", "packed_dynamic")
_KEEP: list[Actor] = []  # actors live to the end: freeing one mid-run must not race the other ranks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--samples", type=int, default=64, help="global batch rows (all ranks)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt")
    ap.add_argument("--prompt-len", default="40,120", help="min,max prompt tokens")
    ap.add_argument("--response-len", default="1,64", help="min,max response tokens")
    ap.add_argument("--lengths", choices=("uniform", "skewed"), default="uniform", help="response length law")
    ap.add_argument("--micro", type=int, default=8, help="actor.ppo_micro_batch_size_per_gpu (fixed modes)")
    ap.add_argument("--budget", type=int, default=2048, help="actor.ppo_max_token_len_per_gpu (dynamic modes)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def _span(text: str) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split(","))
    return lo, hi


def make_batch(args: argparse.Namespace, vocab: int, pad_id: int) -> Batch:
    """The global GRPO-shaped batch: prompts left-padded, responses right-padded, group-normalized advantages.
    Skewed response lengths: most short, a long tail (lo + (hi - lo) * u^3)."""
    rng = random.Random(args.seed)
    (p_lo, p_hi), (r_lo, r_hi) = _span(args.prompt_len), _span(args.response_len)
    prompts, responses = [], []
    for _ in range(-(-args.samples // args.group)):
        prompt = [rng.randrange(5, vocab) for _ in range(rng.randint(p_lo, p_hi))]
        for _ in range(args.group):
            u = rng.random() ** (3 if args.lengths == "skewed" else 1)
            n = r_lo + round(u * (r_hi - r_lo))
            prompts.append(prompt)
            responses.append([rng.randrange(5, vocab) for _ in range(n)])
    prompts, responses = prompts[: args.samples], responses[: args.samples]
    p_width, r_width = max(map(len, prompts)), max(map(len, responses))
    ids = torch.full((args.samples, p_width + r_width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, p_width - len(p) : p_width + len(r)] = torch.tensor(p + r)
        attn[i, p_width - len(p) : p_width + len(r)] = 1
    loss_mask = attn[:, p_width:].float()
    gen = torch.Generator().manual_seed(args.seed)
    scores = torch.randn(args.samples, generator=gen).view(-1, args.group)
    adv = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)).view(-1, 1)
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        loss_mask=loss_mask,
        rollout_log_probs=torch.zeros_like(loss_mask),
        group_ids=torch.arange(args.samples) // args.group,
        termination=torch.zeros(args.samples, dtype=torch.long),
        weights=torch.ones(args.samples),
        advantages=adv * loss_mask,
    )


def configure(cfg: Config, mode: str, args: argparse.Namespace) -> None:
    cfg.model.use_remove_padding = mode.startswith("packed")
    cfg.actor.use_dynamic_bsz = mode.endswith("dynamic")
    cfg.actor.ppo_micro_batch_size_per_gpu = args.micro
    cfg.actor.ppo_max_token_len_per_gpu = args.budget


# ---- the bare loop -----------------------------------------------------------------------------------------


def bare_padded_loss(
    model: torch.nn.Module, b: Batch, rows: slice | torch.Tensor, tokens: float, device: torch.device
) -> tuple[torch.Tensor, int]:
    """The PPO surrogate of `rows` on the columns some row uses; also the cells computed."""
    p = b.prompt_width
    mask = b.attention_mask[rows]
    used = mask.any(0).nonzero().flatten()
    first, end = min(int(used[0]), p - 1), max(int(used[-1]) + 1, p + 1)
    ids = b.input_ids[rows][:, first:end].to(device)
    out = model(
        input_ids=ids,
        attention_mask=mask[:, first:end].to(device),
        position_ids=b.position_ids[rows][:, first:end].to(device),
        use_cache=False,
    )
    logits = out.logits[:, p - first - 1 : end - first - 1].float()  # column c predicts the token at c + 1
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, p - first :].unsqueeze(-1)).squeeze(-1)
    keep = end - p
    lm = b.loss_mask[rows][:, :keep].to(device)
    adv = b.advantages[rows][:, :keep].to(device)  # type: ignore[index]
    ratio = torch.exp(logp - logp.detach())
    return -(ratio * adv * lm).sum() / tokens, ids.numel()


def bare_packed_loss(
    model: torch.nn.Module, b: Batch, rows: slice | torch.Tensor, tokens: float, device: torch.device
) -> tuple[torch.Tensor, int]:
    """The PPO surrogate of `rows` forwarded as one row of their real tokens, positions restarting per sample."""
    mask = b.attention_mask[rows].bool()
    lengths = mask.sum(1)
    resp = mask[:, b.prompt_width :].sum(1)
    ids = b.input_ids[rows][mask]
    pos = torch.cat([torch.arange(n) for n in lengths.tolist()])
    ends = lengths.cumsum(0)
    targets = torch.cat([torch.arange(e - r, e) for e, r in zip(ends.tolist(), resp.tolist(), strict=True)])
    out = model(input_ids=ids[None].to(device), position_ids=pos[None].to(device), use_cache=False)
    logits = out.logits[0, (targets - 1).to(device)].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[targets].to(device).unsqueeze(-1)).squeeze(-1)
    valid = torch.arange(b.response_width) < resp.unsqueeze(1)
    lm = b.loss_mask[rows][valid].to(device)
    adv = b.advantages[rows][valid].to(device)  # type: ignore[index]
    ratio = torch.exp(logp - logp.detach())
    return -(ratio * adv * lm).sum() / tokens, len(ids)


def bare_update(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    b: Batch,
    plan: list[slice | torch.Tensor],
    tokens: float,
    packed: bool,
    grad_clip: float,
    device: torch.device,
) -> int:
    """One optimizer step over the micro-batches `plan` of this rank's rows; returns the cells computed."""
    opt.zero_grad(set_to_none=True)
    cells = 0
    for rows in plan:
        loss, n = (bare_packed_loss if packed else bare_padded_loss)(model, b, rows, tokens, device)
        loss.backward()
        cells += n
    params = [p for p in model.parameters() if p.grad is not None]
    if dist.get_world_size() > 1:
        flat = torch.cat([p.grad.flatten() for p in params])  # type: ignore[union-attr]
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
            offset += n
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    return cells


# ---- timing ------------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.get_world_size() > 1:
        dist.barrier()


def turns(
    calls: dict[str, Callable[[], Any]], repeats: int, device: torch.device
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall seconds, this process's CPU seconds) of each call over `repeats` rounds after one warm-up each; the
    calls take turns. On CPU with one thread per rank, CPU seconds are what the call itself costs: other jobs
    taking the core stretch the wall time, not them."""
    for call in calls.values():
        call()
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeats):
        for key, call in calls.items():
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            call()
            _sync(device)
            wall[key].append(time.perf_counter() - t0)
            cpu[key].append(time.process_time() - c0)
    return wall, cpu


def measure_mode(
    mode: str,
    args: argparse.Namespace,
    cfg: Config,
    mesh: Any,
    local: Batch,
    bare: tuple[torch.nn.Module, torch.optim.Optimizer],
    global_tokens: float,
    device: torch.device,
) -> dict[str, Any]:
    configure(cfg, mode, args)
    torch.manual_seed(0)
    actor = Actor(
        cfg.model,
        cfg.actor,
        mesh,
        device,
        temperature=1.0,
        mini_batch_samples=len(local),
        micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu,
        max_response_length=local.response_width,
        total_steps=1,
    )
    _KEEP.append(actor)
    group = dp_group(mesh)
    steps = plan_micro_batches(
        local.attention_mask,
        local.response_width,
        args.micro,
        actor.token_budget,
        cfg.model.use_remove_padding,
        group,
    )
    plan = [s.rows for s in steps if s.live]
    loss_tokens = float(local.train_mask.sum())
    loss_tokens_t = torch.tensor([loss_tokens], dtype=torch.float64, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(loss_tokens_t)
    loss_tokens = float(loss_tokens_t.item())
    model, opt = bare
    metrics: dict[str, float] = {}
    cells: dict[str, int] = {}

    def ours() -> None:
        metrics.update(actor.update(local))

    def bare_call(packed: bool) -> Callable[[], None]:
        def call() -> None:
            cells["packed" if packed else "padded"] = bare_update(
                model, opt, local, plan, loss_tokens, packed, cfg.actor.grad_clip, device
            )

        return call

    calls: dict[str, Callable[[], Any]] = {"ours": ours, "bare": bare_call(False)}
    if cfg.model.use_remove_padding:
        calls["bare_packed"] = bare_call(True)
    times, cpu = turns(calls, args.repeats, device)
    row: dict[str, Any] = {
        "mode": mode,
        "micro_batches": len(steps),
        "padding_frac": metrics["perf/padding_frac"],
        "bare_padding_frac": 1.0 - float(local.attention_mask.sum()) / cells["padded"],
    }
    for key, ts in times.items():
        s = statistics.median(ts)
        row |= {f"{key}_s": s, f"{key}_times": ts, f"{key}_tokens_per_s": global_tokens / s}
        row |= {f"{key}_cpu_s": statistics.median(cpu[key]), f"{key}_cpu_times": cpu[key]}
    row["ratio"] = row["ours_tokens_per_s"] / row["bare_tokens_per_s"]
    if device.type == "cpu":  # on an accelerator the host's CPU seconds say little about the update's cost
        row["ratio_cpu"] = row["bare_cpu_s"] / row["ours_cpu_s"]
    if "bare_packed_s" in row:
        row["ratio_vs_bare_packed"] = row["ours_tokens_per_s"] / row["bare_packed_tokens_per_s"]
    return row


def main() -> None:
    args = parse_args()
    env = read_env("auto")
    init_world(env)
    cfg = Config()
    cfg.model.path = str(args.model.resolve())
    mesh = fsdp_mesh(env.device.type, env.world_size, -1)
    model: Any = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
    model.to(env.device)
    model.config.use_cache = False
    model.train()
    a = cfg.actor
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(a.betas[0], a.betas[1]), weight_decay=a.weight_decay)
    full = make_batch(args, model.config.vocab_size, int(model.config.pad_token_id or 0))
    per = len(full) // env.world_size
    local = full.select(slice(env.rank * per, (env.rank + 1) * per))
    global_tokens = float(full.attention_mask[: per * env.world_size].sum())
    rows = []
    for mode in args.modes.split(","):
        t0 = time.perf_counter()
        row = measure_mode(mode, args, cfg, mesh, local, (model, opt), global_tokens, env.device)
        rows.append(row)
        if env.rank == 0:
            packed = f", bare packed {row['bare_packed_tokens_per_s']:.0f}" if "bare_packed_s" in row else ""
            print(
                f"  {mode}: ours {row['ours_tokens_per_s']:.0f} tok/s, bare {row['bare_tokens_per_s']:.0f}{packed}, "
                f"ratio {row['ratio']:.2f}, padding {row['padding_frac']:.2f} ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    if env.rank == 0:
        rec = {
            "model": args.model.name,
            "params": sum(p.numel() for p in model.parameters()),
            "hidden_size": model.config.hidden_size,
            "num_layers": model.config.num_hidden_layers,
            "ranks": env.world_size,
            "device": env.device.type,
            "dtype": "float32",
            "torch_threads": torch.get_num_threads(),
            "samples": len(full),
            "group": args.group,
            "prompt_len": args.prompt_len,
            "response_len": args.response_len,
            "lengths": args.lengths,
            "micro": args.micro,
            "budget": args.budget,
            "repeats": args.repeats,
            "real_tokens": global_tokens,
            "response_tokens": float(full.loss_mask.sum()),
            "cells": full.attention_mask.numel(),
            "rows": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rec, indent=1) + "\n")
    end_process()


if __name__ == "__main__":
    main()
