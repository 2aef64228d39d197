"""The floating-point work of an actor update, for perf/tflops/actor and perf/mfu/actor.

Counted as model FLOPs of the tokens the update computes (each multiply-add 2; a backward twice its forward, so
training is 3x the forward), not of what a kernel happens to do:

    dense      6 * D * T        D: the weights of the model's matrix products a token passes through (its layers'
                                linear weights; a mixture of experts' top-k of its experts), T: tokens computed
    head       6 * V * H * R    the LM head over the R positions that predict a response token (the chunked head
                                runs there only)
    attention  12 * L * Hq * d * P    P: (query, key) pairs, causal: a row of n tokens has n (n + 1) / 2

T counts each token once as computed: a prompt shared by its samples (`model.use_shared_prefix`) once, as are its
attention pairs among themselves (each response's queries still meet the prompt's keys, as in a row of its own).
Padding is not counted. A shared prompt of length p saves p (p + 1) / 2 pairs per copy; the saved copies' pairs are
estimated from the batch's mean prompt length (exact where a batch's prompts are equally long).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PEAK_TFLOPS = {
    "B200": 2250.0,
    "H200": 989.0,
    "H100": 989.0,  # SXM; the PCIe card is matched first
    "H100 PCIe": 756.0,
    "H800": 989.0,
    "H20": 148.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "A10G": 70.0,
    "L4": 121.0,
}
"""Dense bfloat16 / float16 tensor-core peaks per device (TFLOP/s, the vendors' datasheets, without sparsity), by
the name CUDA reports. perf/mfu/actor is logged for these devices with a 16-bit compute dtype only."""


@dataclass(frozen=True)
class ModelFlops:
    dense: int
    """Weights of the matrix products one token passes through, outside the LM head."""
    head: int
    """The LM head's weights (vocabulary x hidden); 0 for a value model's head (counted in `dense`)."""
    attention: int
    """Layers x query heads x head dimension: a (query, key) pair's multiply-adds per product (QK^T, then AV)."""

    @staticmethod
    def of(model: torch.nn.Module) -> ModelFlops:
        """Counted from the modules: every Linear but the output embedding (the head) and any other module's
        2-D weight (a router's), a 3-D experts weight [E, a, b] as a x b times the config's experts per token; the
        attention's sizes from the text config."""
        get = getattr(model, "get_output_embeddings", None)
        head = get() if callable(get) else None
        config = getattr(model, "config", None)
        text = config.get_text_config() if config is not None else None
        top_k = int(getattr(text, "num_experts_per_tok", 0) or 0)
        dense = 0
        for module in model.modules():
            if module is head or isinstance(module, torch.nn.Embedding):
                continue
            if isinstance(module, torch.nn.Linear):
                dense += module.in_features * module.out_features
                continue
            for p in module.parameters(recurse=False):  # a router's [E, H]; fused experts' [E, a, b]
                if p.dim() == 2:
                    dense += p.shape[0] * p.shape[1]
                elif p.dim() == 3:
                    dense += top_k * p.shape[1] * p.shape[2]
        head_weights = head.in_features * head.out_features if isinstance(head, torch.nn.Linear) else 0
        if text is None:
            return ModelFlops(dense, head_weights, 0)
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        return ModelFlops(dense, head_weights, int(text.num_hidden_layers) * heads * head_dim)


def causal_pairs(lengths: torch.Tensor) -> float:
    """(query, key) pairs of causal rows of these lengths: sum of n (n + 1) / 2."""
    n = lengths.to(torch.float64)
    return float((n * (n + 1) / 2).sum())


def training_flops(model: ModelFlops, tokens: float, head_positions: float, pairs: float) -> float:
    """Forward and backward FLOPs of `tokens` computed, `head_positions` through the LM head and `pairs`
    (query, key) pairs of attention."""
    return 6.0 * (model.dense * tokens + model.head * head_positions) + 12.0 * model.attention * pairs


def shared_pairs(pairs: float, real: float, computed: float, prompts: float, samples: float) -> float:
    """`pairs` counted as separate rows, less those of the prompt copies a shared prompt saved: `real - computed`
    tokens, in copies of the mean prompt length (`prompts` tokens over `samples`)."""
    saved = max(real - computed, 0.0)
    if not saved or not samples:
        return pairs
    mean = prompts / samples
    return max(pairs - saved * (mean + 1) / 2, 0.0)


def peak_tflops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The device's dense peak for `dtype` (`PEAK_TFLOPS`), or None where it is not known here (CPUs, float32)."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):  # "H100 PCIe" before "H100", "L40S" before "L40"
        if key in name:
            return PEAK_TFLOPS[key]
    return None
