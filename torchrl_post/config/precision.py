"""Dtypes by device: what `auto` means for rollout.dtype and the FSDP roles' param_dtype (one table)."""

from __future__ import annotations

AUTO_DTYPE = {"cpu": "float32", "cuda": "bfloat16"}
"""CPU: float32 (engine and trainer agree to about 1e-6, the parity tests' premise). CUDA: bfloat16, the dtype
vLLM's FlashAttention/FlashInfer backends take and the tensor cores run at full rate; the trained weights stay in
model.dtype (float32 master weights under FSDP's mixed precision)."""


def resolve_dtype(value: str, device_type: str) -> str:
    """A dtype key's value with `auto` resolved for `device_type` (any accelerator but CUDA: float32)."""
    return AUTO_DTYPE.get(device_type, "float32") if value == "auto" else value
