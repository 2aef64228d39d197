"""Token log-probabilities and entropy straight from hidden states, chunked over positions: the LM head, the
log-softmax and the gathered target in one pass (and its backward), never the [positions x vocabulary] float32
logits of the whole micro-batch.

    logp_n, ent_n = chunked_log_probs(hidden_nh, weight_vh, bias_v, labels_n, temperature, never, chunk)

For each chunk of c positions: z = (h @ W^T + b).float() (+ a bias on `never` token ids) / temperature,
lse = logsumexp(z), log p(label) = z[label] - lse, entropy = lse - sum(softmax(z) * z). The backward recomputes z
chunk by chunk from the saved hidden states and the (N,) logsumexp and entropy:

    d log p(label) / dz = onehot(label) - p          d entropy / dz = -p * (log p + entropy)

so peak memory is two [c x V] float32 tensors whatever the response length (Qwen's 151,936-token vocabulary:
1,024 positions x V x 4 bytes = 0.62 GB per copy; a whole 32 x 1,024 micro-batch would be 20 GB per copy), plus
the logits of the first `keep` positions, which the forward keeps for the backward where a gradient is wanted
(`logprobs.HEAD_KEEP_BYTES`; the backward then skips their h @ W^T, a quarter of the head's work). With c >= N it
computes what `torch.log_softmax` over the full logits computes, to float32 rounding. The head weight's gradient
is a sum over chunks: for a 16-bit weight it is summed in a float32 [V x H] (one rounding to the weight's dtype at
the end, as autograd's single matmul over all positions has, not one per chunk).

With a `truncation` (the sampler's top-k / top-p, `algos/sampling_support.py`) log p(label) is renormalised on the
kept set S of each position (the label always in it): lse_S = logsumexp over S, log p(label) = z[label] - lse_S,
and its gradient onehot(label) - p_S, where p_S = p exp(lse - lse_S) on S and 0 elsewhere. The forward saves each
position's threshold (N,), so the backward rebuilds S from the recomputed z without sorting again; the entropy
stays the full distribution's. The forward's threshold sorts SORT_ROWS positions at a time, and S is a bool [c x V].
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchrl_post.algos.sampling_support import Truncation, support_mask, support_threshold


def _scaled_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    never: tuple[int, ...],
    never_bias: float,
) -> torch.Tensor:
    """[c, H] -> the float32 logits [c, V] the sampler sees: the head in the weight's dtype (as the model's own
    forward computes it), then float32, the never-generated bias, the temperature (0: greedy, unscaled)."""
    z = torch.nn.functional.linear(hidden, weight, bias).float()
    if never:
        z[:, list(never)] += never_bias
    if temperature > 0 and temperature != 1:
        z.div_(temperature)  # in place: z is this call's own tensor
    return z


def _accumulator_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the backward sums the head weight's gradient in: float32 for a 16-bit weight, so the sum over
    chunks is rounded to the weight's dtype once at the end, not once per chunk (a 151,936 x 3,584 float32 [V, H]
    is 2.2 GB, counted by the memory plan); a float32 weight's own dtype, summed in place."""
    return torch.float32 if weight.dtype in (torch.bfloat16, torch.float16) else weight.dtype


class _ChunkedHead(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        temperature: float,
        never: tuple[int, ...],
        never_bias: float,
        chunk: int,
        truncation: Truncation | None,
        keep: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        kept_z: list[torch.Tensor] = []  # the first chunks' logits, for the backward (`keep` positions)
        several = labels.dim() == 2  # [N, j] labels: j log-probabilities per position (the teacher's top-k ids)
        logp = torch.empty(labels.shape, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(ent)
        lse_kept = torch.empty_like(ent) if truncation is not None else lse  # lse_S: over the kept set
        thr = torch.empty_like(ent) if truncation is not None else None
        for s in range(0, n, chunk):
            z = _scaled_logits(hidden[s : s + chunk], weight, bias, temperature, never, never_bias)
            idx = labels[s : s + chunk] if several else labels[s : s + chunk, None]  # [c, j]
            # one exp for both: lse = m + log sum e, entropy = lse - sum(e z) / sum e, with e = exp(z - m)
            top = z.amax(dim=-1, keepdim=True)
            e = (z - top).exp_()
            total = e.sum(-1)
            lse_c = top.squeeze(-1) + total.log()
            ent[s : s + chunk] = lse_c - e.mul_(z).sum(-1) / total
            lse[s : s + chunk] = lse_c
            del e
            lp = z.gather(-1, idx)
            if truncation is None:
                lp -= lse_c[:, None]
            else:  # the first label (the sampled token) on the kept set S; the others over the vocabulary
                assert thr is not None
                thr_c = support_threshold(z, truncation)
                kept_c = torch.logsumexp(z.masked_fill(~support_mask(z, thr_c, idx[:, 0]), -math.inf), dim=-1)
                lse_kept[s : s + chunk] = kept_c
                thr[s : s + chunk] = thr_c.squeeze(-1)
                lp[:, :1] -= kept_c[:, None]
                lp[:, 1:] -= lse_c[:, None]
                del kept_c
            logp[s : s + chunk] = lp if several else lp[:, 0]
            if s + len(z) <= keep:
                kept_z.append(z)
            del z, lse_c, lp  # before the next chunk's logits exist: one chunk's tensors at a time
        ctx.save_for_backward(hidden, weight, bias, labels, lse, ent, lse_kept, thr)
        ctx.set_materialize_grads(False)  # an entropy that no loss reads gets None, and its term is skipped
        ctx.settings = (temperature, never, never_bias, chunk)
        ctx.kept_z = kept_z  # not inputs or outputs: nothing else holds or changes them
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, weight, bias, labels, lse, ent, lse_kept, thr = ctx.saved_tensors
        temperature, never, never_bias, chunk = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=_accumulator_dtype(weight), device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        g_logp = torch.zeros(labels.shape, device=hidden.device) if g_logp is None else g_logp.float()
        g_ent = None if g_ent is None else g_ent.float()
        several = labels.dim() == 2
        kept_z, ctx.kept_z = ctx.kept_z, None
        for i, s in enumerate(range(0, hidden.shape[0], chunk)):
            h = hidden[s : s + chunk]
            if i < len(kept_z):  # the forward's logits (used up in place here, as a recomputed chunk's)
                z, kept_z[i] = kept_z[i], None  # type: ignore[call-overload]
            else:
                z = _scaled_logits(h, weight, bias, temperature, never, never_bias)
            idx = labels[s : s + chunk] if several else labels[s : s + chunk, None]  # [c, j]
            kept = support_mask(z, thr[s : s + chunk, None], idx[:, 0]) if thr is not None else None  # the forward's S
            logq = z.sub_(lse[s : s + chunk, None])  # in place: two [c, V] float32 tensors at a time
            gl = g_logp[s : s + chunk] if several else g_logp[s : s + chunk, None]  # [c, j]
            # d sum_j gl_j log p(label_j) / dz = scatter(gl) - p sum_j gl_j; a truncated first label's p is p_S
            full = gl if kept is None else gl[:, 1:]
            term = full.sum(-1, keepdim=True)  # [c, 1], or [c, V] with the entropy's or the kept set's terms
            if g_ent is None:  # no loss reads the entropy: p in place of log p, one [c, V] tensor
                p = logq.exp_()
            else:
                p = logq.exp()
                term = logq.add_(ent[s : s + chunk, None]).mul_(g_ent[s : s + chunk, None]).add_(term)  # ge (log p + H)
            if kept is not None:  # p_S = p exp(lse - lse_S) on S
                term = torch.addcmul(
                    term, kept, gl[:, :1] * (lse[s : s + chunk, None] - lse_kept[s : s + chunk, None]).exp()
                )
            gz = p.mul_(term).neg_()  # -(gl p_S + ge p (log p + H))
            gz.scatter_add_(-1, idx, gl)
            if temperature > 0 and temperature != 1:
                gz /= temperature
            gz = gz.to(weight.dtype)  # as autograd through the model's own head: its matmuls in the weight's dtype
            if grad_h is not None:
                grad_h[s : s + chunk] = gz @ weight
            if grad_w is not None and grad_w.dtype == gz.dtype:
                grad_w.addmm_(gz.t(), h)  # float32: summed in place, no [V, H] temporary
            elif grad_w is not None:
                grad_w += gz.t() @ h  # the chunk's product rounded once to the weight's dtype, summed in float32
            if grad_b is not None:
                grad_b += gz.float().sum(0)
            del z, logq, p, term, gz, kept  # before the next chunk's logits exist: one chunk's tensors at a time
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None, None, None, None, None, None, None,
        )  # fmt: skip


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    temperature: float,
    never: tuple[int, ...] = (),
    never_bias: float = 0.0,
    chunk: int = 1024,
    truncation: Truncation | None = None,
    keep: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [N, H] (the final norm's output), the LM head's weight [V, H] (and bias [V]), labels [N] ->
    (log p(label) [N], entropy [N]) in float32, at `temperature`; labels [N, j] give log p of each of the j
    labels, [N, j] (the sampled token and the distillation teacher's top-k ids: with a `truncation` the first label
    is renormalised on the kept set, the others are over the whole vocabulary); `never`: token ids whose logits get
    `never_bias` first (the engines' bias on a vision model's placeholders); `chunk`: positions per pass;
    `truncation`: log p(label) renormalised on the sampler's top-k / top-p set (the entropy stays the full one);
    `keep`: the logits of the chunks within the first `keep` positions are kept for the backward instead of
    recomputed there (only where a gradient is wanted: a no-grad forward keeps none)."""
    assert chunk > 0, chunk
    wanted = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logp, ent = _ChunkedHead.apply(
        hidden, weight, bias, labels, temperature, never, never_bias, chunk, truncation, keep if wanted else 0
    )
    return logp, ent


@torch.no_grad()
def chunked_top_k(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    temperature: float,
    never: tuple[int, ...] = (),
    never_bias: float = 0.0,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [N, H] -> the k most likely tokens of each position at `temperature`: (log p [N, k] float32, ids
    [N, k] long), most likely first, chunk by chunk as `chunked_log_probs` (one [c x V] float32 at a time). A
    distillation teacher's top-k, which the student's `chunked_log_probs` with [N, k] labels then scores."""
    n = hidden.shape[0]
    logp = torch.empty(n, k, dtype=torch.float32, device=hidden.device)
    ids = torch.empty(n, k, dtype=torch.long, device=hidden.device)
    for s in range(0, n, chunk):
        z = _scaled_logits(hidden[s : s + chunk], weight, bias, temperature, never, never_bias)
        top, at = z.topk(k, dim=-1)
        logp[s : s + chunk] = top - torch.logsumexp(z, dim=-1, keepdim=True)
        ids[s : s + chunk] = at
        del z
    return logp, ids
