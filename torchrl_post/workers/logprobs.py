"""Per-token logprobs and entropy of the response part of [prompt | response] sequences."""

from __future__ import annotations

import torch
import torch.distributed as dist

from torchrl_post.multimodal.vision import NEVER_GENERATED_BIAS, VisionSpec, model_inputs
from torchrl_post.types import Batch
from torchrl_post.workers.micro_batches import MicroBatch, plan_micro_batches, trim_span
from torchrl_post.workers.packing import can_pack, packed_inputs


def logits_to_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, never: tuple[int, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, V], labels [B, T] -> (log p(label) [B, T], entropy [B, T]), at `temperature`.

    Temperature 0 (greedy) uses the raw logits, as the rollout engine reports them. `never`: token ids whose
    logits get NEVER_GENERATED_BIAS first, as the engines bias them (a vision model's placeholders).
    """
    logits = logits.float()
    if never:
        logits = logits.clone()
        logits[..., list(never)] += NEVER_GENERATED_BIAS
    if temperature > 0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def response_log_probs(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], response_width: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward the model once on `inputs` (`model_inputs`); logprob and entropy of each response token, [B, R]."""
    out = model(**inputs, use_cache=False)
    # The token at column P + t is predicted by the logits at column P + t - 1.
    logits = out.logits[:, -response_width - 1 : -1]
    return logits_to_logprobs(logits, inputs["input_ids"][:, -response_width:], temperature, _never(model))


def _never(model: torch.nn.Module) -> tuple[int, ...]:
    """Token ids the engines never generate (a vision model's placeholders): their logits are biased alike."""
    spec = VisionSpec.of(getattr(model, "config", None))
    return spec.never_generated if spec is not None else ()


@torch.no_grad()
def batched_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    micro: int,
    device: torch.device,
    token_budget: int = 0,
    packed: bool = False,
    group: dist.ProcessGroup | None = None,
    shared: bool = False,
) -> torch.Tensor:
    """Logprobs of every response token of a Batch under `model`, [B, R], on CPU (micro-batches as
    `plan_micro_batches`; `group`: the FSDP ranks that must run as many forwards)."""
    model.eval()
    packed = packed and can_pack(batch)
    out = torch.zeros(batch.loss_mask.shape)
    plan = plan_micro_batches(
        batch.attention_mask, batch.response_width, micro, token_budget, packed, group, device,
        prompts=batch.input_ids if shared else None,
    )  # fmt: skip
    for mb in plan:
        logp = forward_log_probs(model, batch, mb, temperature, device, packed, shared)[0]
        if mb.live:
            out[mb.rows] = logp.float().cpu()
    return out


def padded_forward_log_probs(
    model: torch.nn.Module, batch: Batch, rows: slice | torch.Tensor, temperature: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """response_log_probs of `rows` on their trimmed span, padded back to [b, R]; also the cells computed and the
    real tokens among them."""
    width = batch.response_width
    mask = batch.attention_mask[rows]
    first, kept = trim_span(mask, width)
    end = mask.shape[1] - width + kept
    logp, ent = response_log_probs(model, model_inputs(batch, rows, first, end, device), kept, temperature)
    pad = width - kept
    if pad:
        logp = torch.nn.functional.pad(logp, (0, pad))
        ent = torch.nn.functional.pad(ent, (0, pad))
    return logp, ent, mask.shape[0] * (end - first), int(mask.sum())


# ---- micro-batches: padded rows, or packed (verl's use_remove_padding) -----------------------------------


def packed_forward_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    rows: slice | torch.Tensor,
    temperature: float,
    device: torch.device,
    shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """response_log_probs of `rows` packed without padding (`pack`), [b, R]; also the token cells computed and
    the real tokens among them. Only the columns that predict response tokens go through the LM head
    (`logits_to_keep`)."""
    p, inputs = packed_inputs(model, batch, rows, device, shared)
    out = model(**inputs, logits_to_keep=p.keep.to(device))
    logp, ent = logits_to_logprobs(p.kept(out.logits), p.labels.to(device), temperature, _never(model))
    return p.unpack(logp), p.unpack(ent).detach(), p.cells, p.tokens


def forward_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    micro: MicroBatch,
    temperature: float,
    device: torch.device,
    packed: bool,
    shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The micro-batch's response logprobs and entropy [b, R], the token cells computed and the real tokens
    among them; `packed` only where `can_pack(batch)`, `shared`: packed with each prompt once for the samples
    that share it."""
    if packed:
        return packed_forward_log_probs(model, batch, micro.rows, temperature, device, shared)
    return padded_forward_log_probs(model, batch, micro.rows, temperature, device)
