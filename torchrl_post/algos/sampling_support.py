"""Log-probabilities on the sampler's support: the top-k / top-p truncation the rollout engine samples under.

With rollout.top_k > 0 or rollout.top_p < 1 the engine draws each token from the distribution renormalised over
the tokens it keeps, S, and reports that distribution's logprob (vLLM's logprobs_mode="processed_logprobs"):

    z = (logits + logit bias) / temperature
    log pi_S(y) = z_y - logsumexp_{j in S} z_j            (-inf outside S)

A trainer that scores y over the whole vocabulary gets log pi(y) = log pi_S(y) + log pi(S): the log of the kept
mass, which is no policy change, rides in every exp(new - rollout) and biases the rollout correction and the
PPO ratio. Scoring the trainer's old and current logprobs on the same kind of support removes it:

    logp_nv = support_log_probs(logits_nv, Truncation(top_k, top_p), labels_n)

What vLLM 0.32's processed logprobs include (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py):
- float32 logits, then the logits processors: allowed ids, bad words, min tokens, logit bias (the trainer's
  NEVER_GENERATED_BIAS), penalties (sampler.py:99);
- an all-greedy batch stops there: log_softmax of those logits, no temperature, no truncation (sampler.py:264-274);
- else the temperature (sampler.py:279), min_p (sampler.py:285), then top-k and top-p (sampler.py:289 ->
  topk_topp_sampler.py:460 `apply_top_k_top_p`), and the log_softmax of the masked logits (forward_cpu :333,
  forward_native :279; FlashInfer, which returns no logits, is not used in a processed mode: :220).

The support, as `apply_top_k_top_p_pytorch` (topk_topp_sampler.py:473) builds it from the tempered logits z:
- top-k: every token whose logit is >= the k-th largest (ties at the k-th are all kept: :501, and :536 for top-k
  alone);
- then top-p over the top-k set renormalised: sort ascending (:494), cumulative softmax, drop the tokens whose
  cumulative mass is <= 1 - top_p (:508; exactly 1 - top_p is dropped), never the largest (:510). A token is kept
  iff the mass ranked strictly above it is < top_p: the smallest head of the distribution reaching top_p.

Here the kept set is `z >= threshold`, the threshold being the smallest logit that vLLM's rule keeps. Two
deliberate differences, both about exact ties, where vLLM itself is not one rule: a tie at the top-p boundary is
kept whole (vLLM's unstable sort keeps an arbitrary part of it), and the CUDA Triton kernel (topk_topp_triton.py:384)
keeps exactly k of a tie at the k-th logit where the PyTorch path keeps them all (as here). Untied logits give
vLLM's set exactly.

The sampled token is always in S (labels): the trainer's logits differ from the engine's by numerical noise (and
by the update), so its own boundary can fall just above a token the engine kept; log pi_S(y) must stay finite, and
adding y changes the normaliser by y's own mass, which the importance ratio then measures as the mismatch it is.

The trainer's entropy metric stays the full distribution's (workers/logprobs.py): it describes the policy, not
the sampler. Temperature 0 (greedy) has no support to renormalise on (vLLM ignores top-k/top-p there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SORT_ROWS = 256
"""Rows sorted at a time for the top-p threshold: a sort holds values and indices (3 float32 copies) and the
cumulative mass of its rows; 256 rows of Qwen's 151,936-token vocabulary is 0.6 GB."""


@dataclass(frozen=True)
class Truncation:
    """The training sampler's top-k / top-p (rollout.top_k, rollout.top_p) that logprobs are renormalised on."""

    top_k: int = 0
    """Keep the tokens whose logit is at least the k-th largest; 0 (or >= the vocabulary): no top-k."""
    top_p: float = 1.0
    """Then keep the smallest head of the (top-k) distribution whose mass reaches top_p; 1.0: no top-p."""

    def describe(self) -> str:
        parts = ([f"top_k={self.top_k}"] if self.top_k > 0 else []) + (
            [f"top_p={self.top_p:g}"] if self.top_p < 1 else []
        )
        return ", ".join(parts) or "none"


def sampler_truncation(temperature: float, top_k: int, top_p: float) -> Truncation | None:
    """What a sampler at these parameters cuts: None where it keeps every token, and at temperature 0 (greedy
    decoding ignores top-k and top-p in vLLM and in transformers' generate alike)."""
    if temperature <= 0 or (top_k <= 0 and top_p >= 1):
        return None
    return Truncation(max(top_k, 0), top_p)


@torch.no_grad()
def support_threshold(logits_nv: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """logits [..., V] (tempered) -> the smallest logit the sampler keeps, [..., 1] float32 (-inf: keeps all)."""
    v = logits_nv.shape[-1]
    flat_nv = logits_nv.reshape(-1, v)
    out_n1 = torch.full((flat_nv.shape[0], 1), -math.inf, dtype=torch.float32, device=logits_nv.device)
    k = truncation.top_k if 0 < truncation.top_k < v else 0
    p = truncation.top_p
    if p >= 1:
        if k:  # top-k alone: no sort, as vLLM's apply_top_k_only
            out_n1 = flat_nv.float().topk(k, dim=-1).values[:, -1:]
        return out_n1.view(*logits_nv.shape[:-1], 1)
    for s in range(0, flat_nv.shape[0], SORT_ROWS):
        z_sort = flat_nv[s : s + SORT_ROWS].float().sort(dim=-1).values  # ascending, as vLLM sorts
        dropped = z_sort < z_sort[:, v - k : v - k + 1] if k else torch.zeros_like(z_sort, dtype=torch.bool)
        mass = z_sort.masked_fill(dropped, -math.inf).softmax(dim=-1).cumsum_(dim=-1)
        dropped |= mass <= 1 - p
        dropped[:, -1] = False  # the largest is always kept
        first = dropped.sum(dim=-1, keepdim=True)  # each rule drops a prefix of the ascending row: so does the union
        out_n1[s : s + SORT_ROWS] = z_sort.gather(-1, first)
        del z_sort, dropped, mass  # one block's temporaries at a time
    return out_n1.view(*logits_nv.shape[:-1], 1)


def support_mask(
    logits_nv: torch.Tensor, threshold_n1: torch.Tensor, labels_n: torch.Tensor | None = None
) -> torch.Tensor:
    """The kept set S as a bool [..., V]: logits at or above the threshold, and each row's label."""
    keep_nv = logits_nv >= threshold_n1
    if labels_n is not None:
        keep_nv.scatter_(-1, labels_n.unsqueeze(-1), True)
    return keep_nv


def support_log_probs(
    logits_nv: torch.Tensor, truncation: Truncation, labels_n: torch.Tensor | None = None
) -> torch.Tensor:
    """logits [..., V] (already divided by the temperature) -> log pi_S [..., V], float32: the log-softmax over
    the top-k / top-p kept set S (plus `labels` [...], the sampled tokens), -inf outside it. Differentiable in the
    kept logits; S itself is a constant of the logits' values."""
    z_nv = logits_nv.float()
    keep_nv = support_mask(z_nv, support_threshold(z_nv, truncation), labels_n)
    return z_nv.masked_fill(~keep_nv, -math.inf).log_softmax(dim=-1)
