"""Update benchmark: tokens/s of `Actor.update` against a bare PyTorch loop over the same micro-batches (`worker`).

A seeded GRPO-shaped batch; modes fixed, dynamic, packed, packed_dynamic; SETTINGS. `--threads` torch threads a rank.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from benchmarks import common
from benchmarks.common import SIZES, TINY, ModelSize, model_dir
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process
from torchrl_post.distributed.placement import dp_group, fsdp_mesh
from torchrl_post.engines.batch import pad_samples
from torchrl_post.types import Batch
from torchrl_post.workers.actor import Actor
from torchrl_post.workers.micro_batches import plan_micro_batches

NAME = "update"
# mode -> model, samples, group, micro-batch rows, token budget, repeats, the launches' (ranks, response lengths)
SETTINGS: dict[str, tuple[ModelSize, int, int, int, int, int, tuple[tuple[int, str], ...]]] = {
    "full": (SIZES["qwen2-10m"], 64, 8, 8, 1536, 3, ((1, "uniform"), (2, "uniform"), (1, "skewed"))),
    "quick": (SIZES["qwen2-10m"], 16, 8, 4, 768, 2, ((1, "uniform"),)),
    "tiny": (TINY, 8, 4, 4, 512, 1, ((1, "uniform"),)),
}
PROMPT_LEN, RESPONSE_LEN = "40,120", "1,64"
MODES = ("fixed", "dynamic", "packed", "packed_dynamic")
COLUMNS = [
    ("mode", "mode", "{}"), ("ours tok/s", "ours_tokens_per_s", "{:.0f}"), ("bare tok/s", "bare_tokens_per_s", "{:.0f}"),
    ("ratio", "ratio", "{:.2f}"), ("ratio (CPU s)", "ratio_cpu", "{:.2f}"),
    ("bare packed tok/s", "bare_packed_tokens_per_s", "{:.0f}"), ("ours / bare packed", "ratio_vs_bare_packed", "{:.2f}"),
    ("padding frac", "padding_frac", "{:.2f}"), ("bare padding frac", "bare_padding_frac", "{:.2f}"),
    ("micro-batches", "micro_batches", "{}"), ("ours s", "ours_s", "{:.2f}"), ("bare s", "bare_s", "{:.2f}"),
    ("bare packed s", "bare_packed_s", "{:.2f}"),
]  # fmt: skip
_KEEP: list[Actor] = []  # actors live to the end: freeing one mid-run must not race the other ranks
OPTIONS: common.Options = {
    "--repeats": {"type": int},
    "--threads": {"type": int, "default": 1, "help": "CPU: torch threads per rank"},
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode(args)
    size, samples, group, micro, budget, repeats, launches = SETTINGS[mode]
    repeats = args.repeats or repeats
    runs = []
    for ranks, lengths in launches:
        print(f"  {size.name}, {ranks} rank(s), {lengths} lengths, {repeats} repeats ...", flush=True)
        worker_args = {
            "model": model_dir(size), "samples": samples, "group": group, "prompt_len": PROMPT_LEN,
            "response_len": RESPONSE_LEN, "lengths": lengths, "micro": micro, "budget": budget, "repeats": repeats,
        }  # fmt: skip
        env = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(args.threads)}
        tag = f"update_{size.name}_{ranks}r_{lengths}"
        runs.append(common.run_worker(tag, "benchmarks.update", ranks, worker_args, env))
    return {"mode": mode, "repeats": repeats, "threads": args.threads, "runs": runs, "loadavg_1m": common.load_1m()}


def make_batch(args: Any, vocab: int, pad_id: int) -> Batch:
    """The global GRPO-shaped batch; skewed response lengths are lo + (hi - lo) * u^3 (most short, a long tail)."""
    rng = random.Random(args.seed)
    (p_lo, p_hi), (r_lo, r_hi) = (tuple(int(x) for x in s.split(",")) for s in (args.prompt_len, args.response_len))
    prompts, responses = [], []
    for _ in range(-(-args.samples // args.group)):
        prompt = [rng.randrange(5, vocab) for _ in range(rng.randint(p_lo, p_hi))]
        for _ in range(args.group):
            u = rng.random() ** (3 if args.lengths == "skewed" else 1)
            prompts.append(prompt)
            responses.append([rng.randrange(5, vocab) for _ in range(r_lo + round(u * (r_hi - r_lo)))])
    prompts, responses = prompts[: args.samples], responses[: args.samples]
    zeros, ones = ([[x] * len(r) for r in responses] for x in (0.0, 1.0))
    groups = [i // args.group for i in range(args.samples)]
    batch = pad_samples(prompts, responses, zeros, ones, groups, ["stop"] * args.samples, pad_id)
    scores = torch.randn(args.samples, generator=torch.Generator().manual_seed(args.seed)).view(-1, args.group)
    adv = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)).view(-1, 1)
    batch.advantages = adv * batch.loss_mask
    return batch


def bare_loss(
    model: torch.nn.Module, b: Batch, rows: slice | torch.Tensor, tokens: float, device: torch.device, packed: bool
) -> tuple[torch.Tensor, int]:
    """The PPO surrogate of `rows` and the cells computed: padded (the columns some row uses) or packed."""
    p = b.prompt_width
    if packed:
        mask = b.attention_mask[rows].bool()
        lengths, resp = mask.sum(1), mask[:, p:].sum(1)
        ids = b.input_ids[rows][mask]
        pos = torch.cat([torch.arange(n) for n in lengths.tolist()])
        ends = lengths.cumsum(0)
        targets = torch.cat([torch.arange(e - r, e) for e, r in zip(ends.tolist(), resp.tolist(), strict=True)])
        out = model(input_ids=ids[None].to(device), position_ids=pos[None].to(device), use_cache=False)
        logits = out.logits[0, (targets - 1).to(device)].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[targets].to(device).unsqueeze(-1)).squeeze(-1)
        valid = torch.arange(b.response_width) < resp.unsqueeze(1)
        lm, adv, cells = b.loss_mask[rows][valid], b.advantages[rows][valid], len(ids)  # type: ignore[index]
    else:
        mask = b.attention_mask[rows]
        used = mask.any(0).nonzero().flatten()
        first, end = min(int(used[0]), p - 1), max(int(used[-1]) + 1, p + 1)
        ids = b.input_ids[rows][:, first:end].to(device)
        out = model(
            input_ids=ids, attention_mask=mask[:, first:end].to(device),
            position_ids=b.position_ids[rows][:, first:end].to(device), use_cache=False,
        )  # fmt: skip
        logits = out.logits[:, p - first - 1 : end - first - 1].float()  # column c predicts the token at c + 1
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, p - first :].unsqueeze(-1)).squeeze(-1)
        keep = end - p
        lm, adv, cells = b.loss_mask[rows][:, :keep], b.advantages[rows][:, :keep], ids.numel()  # type: ignore[index]
    ratio = torch.exp(logp - logp.detach())
    return -(ratio * adv.to(device) * lm.to(device)).sum() / tokens, cells


def bare_update(
    model: torch.nn.Module, opt: torch.optim.Optimizer, b: Batch, plan: list[slice | torch.Tensor], tokens: float,
    packed: bool, grad_clip: float, device: torch.device,
) -> int:  # fmt: skip
    """One optimizer step over the micro-batches `plan`; the cells computed."""
    opt.zero_grad(set_to_none=True)
    cells = 0
    for rows in plan:
        loss, n = bare_loss(model, b, rows, tokens, device, packed)
        loss.backward()
        cells += n
    params = [p for p in model.parameters() if p.grad is not None]
    if dist.get_world_size() > 1:
        flat = torch.cat([p.grad.flatten() for p in params])  # type: ignore[union-attr]
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))  # type: ignore[union-attr]
            offset += p.numel()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    return cells


def measure_mode(
    mode: str, args: Any, cfg: Config, mesh: Any, local: Batch, bare: tuple[torch.nn.Module, torch.optim.Optimizer],
    global_tokens: float, device: torch.device,
) -> dict[str, Any]:  # fmt: skip
    cfg.model.use_remove_padding = mode.startswith("packed")
    cfg.actor.use_dynamic_bsz = mode.endswith("dynamic")
    cfg.actor.ppo_micro_batch_size_per_gpu = args.micro
    cfg.actor.ppo_max_token_len_per_gpu = args.budget
    torch.manual_seed(0)
    actor = common.build_actor(cfg, mesh, device, samples=len(local), response=local.response_width)
    _KEEP.append(actor)
    steps = plan_micro_batches(
        local.attention_mask, local.response_width, args.micro, actor.token_budget, cfg.model.use_remove_padding,
        dp_group(mesh),
    )  # fmt: skip
    plan = [s.rows for s in steps if s.live]
    loss_tokens = torch.tensor([float(local.train_mask.sum())], dtype=torch.float64, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(loss_tokens)
    tokens = float(loss_tokens.item())
    model, opt = bare
    metrics: dict[str, float] = {}
    cells: dict[str, int] = {}

    def bare_call(packed: bool) -> Callable[[], None]:
        key = "packed" if packed else "padded"
        return lambda: cells.update(
            {key: bare_update(model, opt, local, plan, tokens, packed, cfg.actor.grad_clip, device)}
        )

    calls = {"ours": lambda: metrics.update(actor.update(local)), "bare": bare_call(False)}
    if cfg.model.use_remove_padding:
        calls["bare_packed"] = bare_call(True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if dist.get_world_size() > 1:
            dist.barrier()

    turns = common.take_turns(calls, args.repeats, sync)
    row: dict[str, Any] = {
        "mode": mode, "micro_batches": len(steps), "padding_frac": metrics["perf/padding_frac"],
        "bare_padding_frac": 1.0 - float(local.attention_mask.sum()) / cells["padded"],
    }  # fmt: skip
    for key, ts in turns.items():
        wall, cpu = [t[0] for t in ts], [t[1] for t in ts]
        s = statistics.median(wall)
        row |= {f"{key}_s": s, f"{key}_times": wall, f"{key}_tokens_per_s": global_tokens / s}
        row |= {f"{key}_cpu_s": statistics.median(cpu), f"{key}_cpu_times": cpu}
    row["ratio"] = row["ours_tokens_per_s"] / row["bare_tokens_per_s"]
    if device.type == "cpu":  # on an accelerator the host's CPU seconds say little about the update's cost
        row["ratio_cpu"] = row["bare_cpu_s"] / row["ours_cpu_s"]
    if "bare_packed_s" in row:
        row["ratio_vs_bare_packed"] = row["ours_tokens_per_s"] / row["bare_packed_tokens_per_s"]
    return row


def worker(argv: list[str]) -> None:
    """`Actor.update` against the bare loop over the same micro-batches, taking turns (under torchrun)."""
    args = common.worker_args(
        worker.__doc__, argv, model=Path, samples=64, group=8, prompt_len="40,120", response_len="1,64",
        lengths="uniform", micro=8, budget=2048, modes=",".join(MODES), repeats=3, seed=0,
    )  # fmt: skip
    env, cfg = common.worker_init("auto", args.model)
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
        rows.append(measure_mode(mode, args, cfg, mesh, local, (model, opt), global_tokens, env.device))
        if env.rank == 0:
            print(f"  {mode}: ratio {rows[-1]['ratio']:.2f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if env.rank == 0:
        common.write_json(args.out, {
            "model": args.model.name, "params": sum(p.numel() for p in model.parameters()),
            "hidden_size": model.config.hidden_size, "num_layers": model.config.num_hidden_layers,
            "ranks": env.world_size, "device": env.device.type, "dtype": "float32",
            "torch_threads": torch.get_num_threads(), "samples": len(full),
            **{k: vars(args)[k] for k in ("group", "prompt_len", "response_len", "lengths", "micro", "budget", "repeats")},
            "real_tokens": global_tokens, "response_tokens": float(full.loss_mask.sum()),
            "cells": full.attention_mask.numel(), "rows": rows,
        })  # fmt: skip
    end_process()


def markdown(rec: dict[str, Any]) -> str:
    m = rec["machine"]
    parts = [
        "# Update benchmark: the actor's update against a bare PyTorch loop",
        f"{m['cpu_count']} CPUs, torch {m['torch']}; {rec.get('threads', 1)} torch thread(s) per rank; 1-minute "
        f"load average {rec['loadavg_1m']:.1f} at the end. Ours: `Actor.update` (FSDP2, PPO clip loss, clipping, "
        "AdamW); bare: the HF model and torch.optim.AdamW over the same micro-batches (padded, or packed), the "
        "on-policy PPO surrogate, clipping, a gradient all_reduce on 2 ranks. tokens/s: real tokens of the batch / "
        f"seconds of one update, median of {rec['repeats']} repeats taking turns. `ratio` = ours / bare padded "
        "tok/s; `ratio (CPU s)`: from rank 0's process CPU seconds; `padding frac`: ours.",
    ]
    for run in rec["runs"]:
        rows = run["rows"]
        ratios = [r["ratio"] for r in rows]
        low = [r["mode"] for r in rows if r["ratio"] < 0.9]
        text = f"Ours / bare: {min(ratios):.2f}x to {max(ratios):.2f}x" + (
            f" (below the 0.9 target: {', '.join(low)})." if low else " (every mode at or above the 0.9 target)."
        )
        if cpu := [r["ratio_cpu"] for r in rows if r.get("ratio_cpu")]:
            text += f" By CPU seconds: {min(cpu):.2f}x to {max(cpu):.2f}x."
        for r in rows:
            if r.get("bare_packed_tokens_per_s"):
                text += (
                    f" {r['mode']}: packing removes {r['bare_padding_frac']:.0%} padding, the bare packed loop runs "
                    f"at {r['bare_packed_tokens_per_s'] / r['bare_tokens_per_s']:.2f}x the bare padded one."
                )
        parts += [
            f"## {run['model']} ({run['params'] / 1e6:.1f}M parameters, {run['dtype']}, {run['device']}), "
            f"{run['ranks']} rank(s), {run['samples']} samples, {run['lengths']} response lengths",
            f"Prompts {run['prompt_len'].replace(',', '-')} tokens in groups of {run['group']}, responses "
            f"{run['response_len'].replace(',', '-')} tokens; {run['real_tokens']:.0f} real tokens in {run['cells']} "
            f"cells; micro-batches of {run['micro']} rows (fixed) or {run['budget']} tokens (dynamic).",
            common.table(rows, COLUMNS),
            f"{text} Load average {run['loadavg_1m']:.1f} after this run.",
        ]
    return common.blocks(*parts)


def plot(path: Path, rec: dict[str, Any]) -> None:
    runs = rec["runs"]
    fig, axes = common.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.5), squeeze=False)
    for ax, r in zip(axes[0], runs, strict=True):
        series = [
            (label, [row.get(f"{key}_tokens_per_s") or 0.0 for row in r["rows"]])
            for key, label in (("ours", "ours"), ("bare", "bare padded"), ("bare_packed", "bare packed"))
        ]
        common.bars(ax, [row["mode"] for row in r["rows"]], series, ylabel="real tokens / s (whole batch)")
        for bar, row in zip(ax.containers[0], r["rows"], strict=True):  # ours / bare over ours' bars
            ax.annotate(f"{row['ratio']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=8)  # fmt: skip
        ax.set_title(f"{r['model']}, {r['ranks']} rank(s), {r['samples']} samples, {r['lengths']}", fontsize=9)
    common.save_figure(fig, path, "update: Actor.update (ours, ratio ours/bare padded above) vs a bare PyTorch loop")


if __name__ == "__main__":
    common.standalone()
