"""What every trained role shares: AdamW with its lr schedule, gradient clipping over DTensors, global sums."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchrl_post.algos.lr_schedule import lr_factor, warmup_updates
from torchrl_post.config.schema import ActorConfig, CriticConfig


def lr_schedule(cfg: ActorConfig | CriticConfig, total_steps: int) -> Callable[[int], float]:
    """Update index -> factor on the role's lr (`algos/lr_schedule.py`), over the run's `total_steps` updates (one
    scheduler step per training step)."""
    warmup = warmup_updates(cfg.lr_warmup_steps, cfg.lr_warmup_steps_ratio, total_steps)
    style, floor, cycles = cfg.lr_scheduler_type, cfg.min_lr_ratio, cfg.num_cycles
    # A closure, not an object: LambdaLR's state_dict then keeps no schedule keys, only the update count.
    return lambda step: lr_factor(step, warmup, total_steps, style, floor, cycles)


def build_optimizer(
    model: torch.nn.Module,
    lr: float,
    weight_decay: float,
    schedule: Callable[[int], float],
    betas: tuple[float, float] = (0.9, 0.999),
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trained parameters and its LambdaLR: update k trains at lr x schedule(k)."""
    trained = [p for p in model.parameters() if p.requires_grad]  # a LoRA model: its adapter only
    optimizer = torch.optim.AdamW(trained, lr=lr, betas=betas, weight_decay=weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def load_scheduler(scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict[str, Any]) -> None:
    """Restore a checkpointed schedule position (its update count) and set the optimizer's lr to that update's,
    computed from this run's lr and schedule keys: exact on an unchanged config, whatever lr the optimizer's own
    checkpoint carried, and a resume with a new lr or total follows them."""
    bases = list(scheduler.base_lrs)
    scheduler.load_state_dict(state)
    scheduler.base_lrs = bases
    groups = scheduler.optimizer.param_groups
    for group, base, factor in zip(groups, bases, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(scheduler.last_epoch)


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip to `max_norm` (<= 0: only measure); returns the total norm before clipping (inf/nan if non-finite).

    Under `fsdp.offload_policy` the sharded gradients are CPU tensors on an accelerator mesh: their norm is
    reduced over the mesh's CPU backend (the `cpu:gloo,cuda:nccl` process groups) and they are scaled in place
    on CPU, where the optimizer then steps.

    With expert parallelism the experts' gradients are DTensors on the sparse (efsdp, ep) mesh and the rest on
    the dense one: each mesh's norm is reduced over its own ranks, the total is their root sum of squares, and
    each gradient is scaled on its own rank.
    """
    clip = max_norm if max_norm > 0 else float("inf")
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for p in model.parameters():
        if p.grad is not None:
            by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p.grad)
    if len(by_mesh) <= 1:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm.item())
    norms = []
    for grads in by_mesh.values():  # in parameter order: the same meshes in the same order on every rank
        part = torch.nn.utils.get_total_norm(grads, 2.0)
        norms.append((part.full_tensor() if isinstance(part, DTensor) else part).to(torch.float64).cpu())
    total = torch.stack(norms).norm()
    if math.isfinite(total.item()) and total.item() > clip:
        coef = clip / (total.item() + 1e-6)
        for grads in by_mesh.values():
            torch._foreach_mul_([local_tensor(g) for g in grads], coef)
    return float(total.item())


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def pending_optimizer_bytes(model: torch.nn.Module, on_host: bool) -> int:
    """Accelerator bytes AdamW's two moments will take at the first step (this rank's shards, in the parameters'
    dtype); 0 where they live on the host. A colocated engine must leave them free: it starts before the first
    step, when no optimizer state exists yet (memory_plan.py counts the same per trained role)."""
    if on_host:
        return 0
    return sum(2 * local_tensor(p).numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Every state tensor of `optimizer` (AdamW's moments, DTensors or not) to `device`, in place in its state
    dict; its step counters stay where they are (AdamW keeps them on CPU unless capturable)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)


def global_sum(t: torch.Tensor, group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
    """Sum a tensor over the ranks of `group` (on the backend's device), returned on CPU."""
    t = t.to(device)
    dist.all_reduce(t, group=group)
    return t.cpu()
