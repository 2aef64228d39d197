"""Rollout correction (verl's algorithm.rollout_correction): importance weights and rejection masks for the gap
between the rollout engine's policy (the behaviour policy, pi_rollout) and the trainer's proximal policy (pi_old).

For row b and token t, with v_bt = 1 on the trained tokens (mask > 0) and d_bt = v_bt (log pi_old - log pi_rollout):

    token ratio       r_bt = exp(d_bt)
    sequence ratio    s_b  = exp(sum_t d_bt)                  (the product of the row's token ratios)
    geometric mean    g_b  = exp(sum_t d_bt / sum_t v_bt)

Importance sampling (`rollout_is`, cap c = rollout_is_threshold), a weight on each token's policy loss:
    token:    w_bt = min(r_bt, c)                             (truncated IS, TIS)
    sequence: w_bt = min(s_b, c) on every token of row b      (sequence-level TIS)
Rejection (`rollout_rs`, band [low, high] = [rollout_rs_threshold_lower, rollout_rs_threshold]), IcePop-style:
    token:     token t leaves the loss when r_bt is outside the band
    sequence:  row b leaves the loss when s_b is outside it
    geometric: row b leaves the loss when g_b is outside it
Veto (`rollout_token_veto_threshold` v): row b leaves the loss when any of its tokens has r_bt < v.

Log-ratios are exponentiated at most at e^20 (verl's SAFETY_BOUND), so no weight or statistic overflows; the band
and the veto are compared in log space. Everything is detached (the weights change the measure, not the objective).
Deliberately left out: verl's batch renormalisation of the weights and its bypass mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import get_args

import torch

from torchrl_post.config.enums import RSLevel

RS_LEVELS = get_args(RSLevel)
"""The levels `_level` computes ratios at (algorithm.rollout_correction.rollout_rs; rollout_is takes the first two)."""
SAFETY_BOUND = 20.0
"""Largest log-ratio exponentiated (verl's): weights and statistics stay below e^20."""

STAT_SUMS = (
    "tokens", "seqs", "is_w", "is_clip", "is_ratio", "is_ratio_sq", "rs_ratio", "rs_ratio_sq", "rs_masked",
    "rs_seq_masked", "vetoed",
)  # fmt: skip
"""Token-weighted sums of `Corrected.sums` (seqs, rs_seq_masked and vetoed count rows), summed over micro-batches
and ranks."""
STAT_MAXES = ("is_max", "is_neg_min", "rs_max", "rs_neg_min")
"""`Corrected.maxes`, maxed over micro-batches and ranks (a minimum travels negated); -inf without a token."""


@dataclass(frozen=True)
class RolloutCorrection:
    """A run's correction against the rollout engine's logprobs, resolved once by the plan from
    algorithm.rollout_correction.* (verl's names); the default corrects nothing."""

    rollout_is: str | None = None
    """Importance weights: token, sequence, or None (none)."""
    rollout_is_threshold: float = 2.0
    """Cap c of the weights."""
    rollout_rs: str | None = None
    """Rejection: token, sequence, geometric, or None (none)."""
    rollout_rs_threshold: float = 2.0
    """Upper end of the kept band."""
    rollout_rs_threshold_lower: float = 0.5
    """Lower end of the kept band."""
    rollout_token_veto_threshold: float | None = None
    """Rows with a token ratio below it leave the loss; None: no veto."""

    @property
    def rejects(self) -> bool:
        """Tokens or rows may leave the loss (and its denominators)."""
        return self.rollout_rs is not None or self.rollout_token_veto_threshold is not None

    @property
    def active(self) -> bool:
        return self.rollout_is is not None or self.rejects

    def describe(self) -> str:
        parts = []
        if self.rollout_is is not None:
            parts.append(f"{self.rollout_is}-level truncated IS, cap {self.rollout_is_threshold:g}")
        if self.rollout_rs is not None:
            low, high = self.rollout_rs_threshold_lower, self.rollout_rs_threshold
            parts.append(f"{self.rollout_rs} rejection outside [{low:g}, {high:g}]")
        if self.rollout_token_veto_threshold is not None:
            parts.append(f"veto of rows with a token ratio below {self.rollout_token_veto_threshold:g}")
        return "; ".join(parts) or "off"


def rs_band(upper: float | None, lower: float | None, is_threshold: float) -> tuple[float, float]:
    """The rejection band (low, high) from rollout_rs_threshold_lower / rollout_rs_threshold as verl reads them:
    a null upper end is rollout_is_threshold, a null lower end is 1 / upper."""
    high = is_threshold if upper is None else upper
    return (1.0 / high if lower is None else lower), high


@dataclass(frozen=True)
class Corrected:
    """The correction of a set of whole rows [B, R]."""

    weights_bt: torch.Tensor | None
    """Importance weights to multiply the per-token loss by; None without rollout_is."""
    keep_bt: torch.Tensor | None
    """1.0 where the token stays in the loss, 0.0 where it was rejected or vetoed; None when nothing rejects."""
    sums: torch.Tensor
    """[len(STAT_SUMS)] float64, over the trained tokens before rejection."""
    maxes: torch.Tensor
    """[len(STAT_MAXES)] float64."""


def _exp(log_bt: torch.Tensor) -> torch.Tensor:
    return log_bt.clamp(max=SAFETY_BOUND).exp()


def _level(level: str, d_bt: torch.Tensor, valid_bt: torch.Tensor) -> torch.Tensor:
    """log r_bt (token), log s_b (sequence) or log g_b (geometric), [B, R] (a row's value on each of its tokens)."""
    if level == "token":
        return d_bt
    sum_b = d_bt.sum(-1)
    if level == "geometric":
        sum_b = sum_b / valid_bt.sum(-1).clamp(min=1)
    elif level != "sequence":
        raise ValueError(f"unknown rollout correction level {level!r}; expected one of {', '.join(RS_LEVELS)}")
    return sum_b.unsqueeze(-1).expand_as(d_bt)


def _extremes(x_bt: torch.Tensor, valid_bt: torch.Tensor) -> torch.Tensor:
    """(max, -min) of x over the valid tokens; -inf each without one."""
    x = x_bt.double()
    return torch.stack([x.masked_fill(~valid_bt, -math.inf).max(), (-x).masked_fill(~valid_bt, -math.inf).max()])


def correct(
    old_logp_bt: torch.Tensor, rollout_logp_bt: torch.Tensor, mask_bt: torch.Tensor, c: RolloutCorrection
) -> Corrected:
    """Weights, rejection mask and metric sums of the rows in `mask_bt` (the train mask: loss mask x sample
    weight; tokens where it is 0 count nowhere, rows without one are empty). The rows must be whole: the
    sequence and geometric levels sum over each row."""
    valid_bt = mask_bt > 0
    d_bt = torch.where(valid_bt, old_logp_bt.detach() - rollout_logp_bt.detach(), 0.0)
    m_bt = mask_bt.detach().double()
    seq_b = valid_bt.any(-1)
    sums = dict.fromkeys(STAT_SUMS, torch.zeros((), dtype=torch.float64, device=d_bt.device))
    sums["tokens"], sums["seqs"] = m_bt.sum(), seq_b.double().sum()
    none = torch.full((2,), -math.inf, dtype=torch.float64, device=d_bt.device)
    is_ext, rs_ext = none, none
    weights_bt = None
    keep_bt = torch.ones_like(valid_bt)
    if c.rollout_is is not None:
        ratio_bt = _exp(_level(c.rollout_is, d_bt, valid_bt))
        weights_bt = ratio_bt.clamp(max=c.rollout_is_threshold)
        sums["is_w"] = (weights_bt * m_bt).sum()
        sums["is_clip"] = ((weights_bt >= c.rollout_is_threshold) * m_bt).sum()
        sums["is_ratio"] = (ratio_bt * m_bt).sum()
        sums["is_ratio_sq"] = (ratio_bt.double().square() * m_bt).sum()
        is_ext = _extremes(ratio_bt, valid_bt)
    if c.rollout_rs is not None:
        log_bt = _level(c.rollout_rs, d_bt, valid_bt)
        low, high = math.log(c.rollout_rs_threshold_lower), math.log(c.rollout_rs_threshold)
        inside_bt = (log_bt >= low) & (log_bt <= high)
        keep_bt = keep_bt & inside_bt
        ratio_bt = _exp(log_bt)
        sums["rs_ratio"] = (ratio_bt * m_bt).sum()
        sums["rs_ratio_sq"] = (ratio_bt.double().square() * m_bt).sum()
        sums["rs_masked"] = (~inside_bt * m_bt).sum()
        sums["rs_seq_masked"] = (valid_bt & ~inside_bt).any(-1).double().sum()
        rs_ext = _extremes(ratio_bt, valid_bt)
    if c.rollout_token_veto_threshold is not None:
        vetoed_b = (valid_bt & (d_bt < math.log(c.rollout_token_veto_threshold))).any(-1)
        sums["vetoed"] = vetoed_b.double().sum()
        keep_bt = keep_bt & ~vetoed_b.unsqueeze(-1)
    return Corrected(
        weights_bt=weights_bt,
        keep_bt=keep_bt.to(mask_bt.dtype) if c.rejects else None,
        sums=torch.stack([sums[k] for k in STAT_SUMS]),
        maxes=torch.cat([is_ext, rs_ext]),
    )


def correction_metrics(tot: dict[str, float], c: RolloutCorrection) -> dict[str, float]:
    """rollout_corr/* (verl's names, plus this project's is_weight_mean and is_clipfrac) from the STAT_SUMS and
    STAT_MAXES totals: the ratio distributions over the trained tokens before rejection (token-weighted; a
    sequence-level ratio counts once per token of its row, as verl's), the fractions rejected; 0 without a token."""
    tokens, seqs = max(tot["tokens"], 1.0), max(tot["seqs"], 1.0)
    empty = tot["tokens"] <= 0

    def dist(name: str) -> tuple[float, float, float, float]:
        mean = tot[f"{name}_ratio"] / tokens
        std = math.sqrt(max(tot[f"{name}_ratio_sq"] / tokens - mean * mean, 0.0))
        top, bottom = tot[f"{name}_max"], -tot[f"{name}_neg_min"]
        return (0.0, 0.0, 0.0, 0.0) if empty else (mean, std, top, bottom)

    out: dict[str, float] = {}
    if c.rollout_is is not None:
        mean, std, top, bottom = dist("is")
        out |= {
            "rollout_corr/is_weight_mean": tot["is_w"] / tokens,
            "rollout_corr/is_clipfrac": tot["is_clip"] / tokens,
            "rollout_corr/rollout_is_mean": mean,
            "rollout_corr/rollout_is_std": std,
            "rollout_corr/rollout_is_max": top,
            "rollout_corr/rollout_is_min": bottom,
        }
    if c.rollout_rs is not None:
        mean, std, top, bottom = dist("rs")
        out |= {
            "rollout_corr/rollout_rs_mean": mean,
            "rollout_corr/rollout_rs_std": std,
            "rollout_corr/rollout_rs_max": top,
            "rollout_corr/rollout_rs_min": bottom,
            "rollout_corr/rollout_rs_masked_fraction": tot["rs_masked"] / tokens,
            "rollout_corr/rollout_rs_seq_masked_fraction": tot["rs_seq_masked"] / seqs,
        }
    if c.rollout_token_veto_threshold is not None:
        out["rollout_corr/rollout_is_veto_fraction"] = tot["vetoed"] / seqs
    return out
