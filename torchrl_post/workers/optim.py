"""What every trained role shares: AdamW with linear warmup, gradient clipping over DTensors, global sums."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def build_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float, warmup_steps: int, betas: tuple[float, float] = (0.9, 0.999)
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    trained = [p for p in model.parameters() if p.requires_grad]  # a LoRA model: its adapter only
    optimizer = torch.optim.AdamW(trained, lr=lr, betas=betas, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    )
    return optimizer, scheduler


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip to `max_norm` (<= 0: only measure); returns the total norm before clipping (inf/nan if non-finite).

    Under `fsdp.offload_policy` the sharded gradients are CPU tensors on an accelerator mesh: their norm is
    reduced over the mesh's CPU backend (the `cpu:gloo,cuda:nccl` process groups) and they are scaled in place
    on CPU, where the optimizer then steps.
    """
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm.item())


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


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
