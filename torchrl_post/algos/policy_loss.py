"""Policy losses (PPO clipped surrogate with optional dual clip, GSPO, the entropy-control modes Clip-Cov and
KL-Cov) and loss aggregation (verl's mode names). `policy_loss` picks actor.policy_loss's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

import torch

from torchrl_post.config.enums import LossAggMode, PolicyLoss

if TYPE_CHECKING:
    from torchrl_post.config.schema import ActorConfig

LOSS_AGG_MODES = get_args(LossAggMode)  # agg_loss dispatches on each
POLICY_LOSSES = get_args(PolicyLoss)  # policy_loss dispatches on each


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass(frozen=True)
class LossScale:
    """The denominators of one mini-batch, counted over every micro-batch on every data-parallel rank.

    With them each micro-batch's `agg_loss` is its exact share of the mini-batch loss, so the summed
    gradient does not depend on how the mini-batch is split (row counts, token budgets, uneven tails).
    """

    tokens: float
    """Sum of the mask over the mini-batch (all ranks)."""
    seqs: float
    """Rows whose mask is not all zero (all ranks): filtered samples do not count."""
    max_response_length: int
    """data.max_response_length: the constant of seq-mean-token-sum-norm (Dr.GRPO)."""
    dp_size: int = 1
    """Ranks whose gradients FSDP averages: each rank's share is scaled up by it."""

    @staticmethod
    def local(mask_bt: torch.Tensor, max_response_length: int | None = None) -> LossScale:
        """The scale of `mask_bt` taken as the whole mini-batch on one rank."""
        seqs = float((mask_bt.sum(-1) > 0).sum())
        return LossScale(float(mask_bt.sum()), seqs, max_response_length or mask_bt.shape[-1])


def agg_loss(loss_bt: torch.Tensor, mask_bt: torch.Tensor, mode: str, scale: LossScale | None = None) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss (verl's loss_agg_mode names and definitions).

    With S = `scale` (default: this mask alone), m the mask, l the token losses, and "valid" the rows whose
    mask is not all zero:
    token-mean:              sum_bt l m / S.tokens
    seq-mean-token-sum:      sum_b (sum_t l m) / S.seqs
    seq-mean-token-mean:     sum_b (sum_t l m / sum_t m) / S.seqs           (valid rows only)
    seq-mean-token-sum-norm: sum_bt l m / (S.seqs * S.max_response_length)  (Dr.GRPO's constant normaliser,
                             as current verl: the batch size times the maximum response length)
    Each is multiplied by S.dp_size, since FSDP averages the ranks' gradients.
    """
    scale = scale or LossScale.local(mask_bt)
    if mode == "token-mean":
        return (loss_bt * mask_bt).sum() / (max(scale.tokens, 1.0) / scale.dp_size)
    seq_sum_b = (loss_bt * mask_bt).sum(-1)
    seqs = max(scale.seqs, 1.0) / scale.dp_size
    if mode == "seq-mean-token-sum":
        return seq_sum_b.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (seq_sum_b / mask_bt.sum(-1).clamp(min=1)).sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        return seq_sum_b.sum() / (seqs * scale.max_response_length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


@dataclass
class PolicyLossOut:
    loss_bt: torch.Tensor  # per-token loss, before aggregation
    ratio_bt: torch.Tensor
    clipped_bt: torch.Tensor  # 1.0 where the clipped branch was taken (clip_cov / kl_cov: the selected tokens)
    approx_kl_bt: torch.Tensor  # old_logp - logp (k1), for actor/ppo_kl (kl_cov: |logp - old_logp|, as verl)
    dual_clipped_bt: torch.Tensor  # 1.0 where the dual-clip bound -A * clip_c was taken (A < 0); zeros otherwise


def ppo_clip_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    clip_c: float | None = None,
) -> PolicyLossOut:
    """Token-level PPO clipped surrogate: L = max(-A r, -A clip(r, 1 - low, 1 + high)), r = exp(logp - old_logp).

    Dual clip (Ye et al. 2020, verl's clip_ratio_c), when clip_c is given (> 1): for A < 0, L = min(L, -A clip_c),
    which bounds the loss (and zeroes the gradient) of negative-advantage tokens whose ratio exploded.
    """
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"dual-clip clip_c must be > 1, got {clip_c}")
    log_ratio_bt = (logp_bt - old_logp_bt).clamp(-20.0, 20.0)
    ratio_bt = log_ratio_bt.exp()
    unclipped_bt = -adv_bt * ratio_bt
    clipped_bt = -adv_bt * ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_bt = torch.maximum(unclipped_bt, clipped_bt)
    dual_clipped_bt = torch.zeros_like(loss_bt)
    if clip_c is not None:
        bound_bt = -adv_bt * clip_c
        use_bound_bt = (adv_bt < 0) & (loss_bt > bound_bt)
        loss_bt = torch.where(use_bound_bt, bound_bt, loss_bt)
        dual_clipped_bt = use_bound_bt.to(loss_bt.dtype)
    return PolicyLossOut(loss_bt, ratio_bt, (clipped_bt > unclipped_bt).float(), -log_ratio_bt, dual_clipped_bt)


def gspo_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> PolicyLossOut:
    """GSPO (Zheng et al. 2025, verl's gspo): sequence-level ratio with per-token gradient.

    s_b = exp(sum_t m_t (logp_t - old_t) / max(sum_t m_t, 1)); r_bt = sg[s_b] * exp(logp_t - sg[logp_t]), so r
    equals s_b on every token of a sequence while d r_bt / d logp_bt = s_b flows per token. As in verl, log r is
    clamped at 10. L = max(-A r, -A clip(r, 1 - low, 1 + high)); the clip ranges are small (e.g. 3e-4 / 4e-4).
    """
    mask = mask_bt.to(logp_bt.dtype)
    log_ratio_bt = logp_bt - old_logp_bt
    seq_log_ratio_b = (log_ratio_bt * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_seq_ratio_bt = (seq_log_ratio_b.detach().unsqueeze(-1) + logp_bt - logp_bt.detach()).clamp(max=10.0)
    ratio_bt = log_seq_ratio_bt.exp()
    unclipped_bt = -adv_bt * ratio_bt
    clipped_bt = -adv_bt * ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_bt = torch.maximum(unclipped_bt, clipped_bt)
    return PolicyLossOut(
        loss_bt, ratio_bt, (clipped_bt > unclipped_bt).float(), -log_ratio_bt, torch.zeros_like(loss_bt)
    )


def covariance_bt(adv_bt: torch.Tensor, logp_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Per-token centred product cov_t = (A_t - mean A) (logp_t - mean logp), the means over the mask (weighted by
    it) and logp detached: the covariance term of Cui et al. 2025 that drives the entropy change."""
    logp = logp_bt.detach()
    return (adv_bt - masked_mean(adv_bt, mask_bt)) * (logp - masked_mean(logp, mask_bt))


def clip_cov_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    clip_cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
    generator: torch.Generator | None = None,
) -> PolicyLossOut:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"; verl's clip_cov).

    PPO's clipped surrogate L = max(-A r, -A clip(r, 1 - low, 1 + high)), r = exp(logp - old_logp), with a few
    high-covariance tokens detached: candidates are the tokens with m > 0 that PPO's clip did not clip and whose
    `covariance_bt` lies strictly inside (clip_cov_lb, clip_cov_ub); n = max(int(clip_cov_ratio * sum m), 1) of
    them (all, if fewer) are drawn uniformly without replacement with `generator` (CPU; None: the global RNG, as
    verl's torch.randperm). A selected token's loss is 0 (no gradient), an unselected one's is L. No dual clip
    (verl's clip_cov has none). The means, the count and the draw are over the tokens given: per micro-batch
    when the actor calls it, as in verl. `clipped_bt` marks the selected tokens: verl's actor/pg_clipfrac for
    clip_cov is their fraction (the tokens PPO's clip took are not counted). Unlike verl the log ratio is clamped
    to [-20, 20] as in `ppo_clip_loss` (the same loss wherever |logp - old_logp| <= 20).
    """
    log_ratio_bt = (logp_bt - old_logp_bt).clamp(-20.0, 20.0)
    ratio_bt = log_ratio_bt.exp()
    unclipped_bt = -adv_bt * ratio_bt
    clipped_bt = -adv_bt * ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    valid_bt = mask_bt > 0
    cov_bt = covariance_bt(adv_bt, logp_bt, mask_bt)
    candidate_bt = valid_bt & ~(clipped_bt > unclipped_bt) & (cov_bt > clip_cov_lb) & (cov_bt < clip_cov_ub)
    candidates = candidate_bt.flatten().nonzero().squeeze(-1)  # row-major, as verl's torch.nonzero
    n_select = max(int(clip_cov_ratio * float(mask_bt.sum())), 1)
    order = torch.randperm(len(candidates), generator=generator)[:n_select].to(candidates.device)
    selected_bt = torch.zeros_like(valid_bt).flatten()
    selected_bt[candidates[order]] = True
    selected_bt = selected_bt.view_as(valid_bt)
    loss_bt = torch.maximum(unclipped_bt, clipped_bt) * (~selected_bt).to(unclipped_bt.dtype)
    return PolicyLossOut(loss_bt, ratio_bt, selected_bt.to(loss_bt.dtype), -log_ratio_bt, torch.zeros_like(loss_bt))


def kl_cov_loss(
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    kl_cov_ratio: float,
    ppo_kl_coef: float,
) -> PolicyLossOut:
    """KL-Cov (Cui et al. 2025; verl's kl_cov): the unclipped surrogate with a KL penalty on the top-covariance
    tokens.

    Over the N tokens with m > 0 (plain means over them, as verl): cov_t = (A_t - mean A) (logp_t - mean logp),
    logp detached; the k = max(1, int(N * kl_cov_ratio)) tokens of largest cov are selected (none when N = 0).
    L_t = -A_t r_t + ppo_kl_coef * |logp_t - old_logp_t| * selected_t, r = exp(logp - old_logp). No clipping at
    all (as verl). Per micro-batch when the actor calls it, as in verl. `clipped_bt` marks the selected tokens
    (verl logs no pg_clipfrac for kl_cov; here actor/pg_clipfrac is the penalised fraction); `approx_kl_bt` is
    |logp - old_logp|, whose mean verl logs as actor/ppo_kl for kl_cov. As in `ppo_clip_loss` the log ratio in r
    is clamped to [-20, 20].
    """
    log_ratio_bt = logp_bt - old_logp_bt
    ratio_bt = log_ratio_bt.clamp(-20.0, 20.0).exp()
    abs_kl_bt = log_ratio_bt.abs()
    valid = mask_bt.flatten() > 0
    index = valid.nonzero().squeeze(-1)
    selected = torch.zeros_like(valid)
    if len(index):
        adv_n = adv_bt.detach().flatten()[index]
        logp_n = logp_bt.detach().flatten()[index]
        cov_n = (adv_n - adv_n.mean()) * (logp_n - logp_n.mean())
        k = max(1, int(len(index) * kl_cov_ratio))
        selected[index[torch.topk(cov_n, min(k, len(index))).indices]] = True
    selected_bt = selected.view_as(mask_bt).to(logp_bt.dtype)
    loss_bt = -adv_bt * ratio_bt + ppo_kl_coef * abs_kl_bt * selected_bt
    return PolicyLossOut(loss_bt, ratio_bt, selected_bt, abs_kl_bt.detach(), torch.zeros_like(loss_bt))


def policy_loss(
    cfg: ActorConfig,
    logp_bt: torch.Tensor,
    old_logp_bt: torch.Tensor,
    adv_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    generator: torch.Generator | None = None,
) -> PolicyLossOut:
    """The per-token loss of actor.policy_loss over one micro-batch (`mask_bt`: the tokens that train):
    vanilla (`ppo_clip_loss`, dual clip actor.clip_ratio_c), gspo, clip_cov (draws with `generator`), kl_cov."""
    low = cfg.clip_ratio if cfg.clip_ratio_low is None else cfg.clip_ratio_low
    high = cfg.clip_ratio if cfg.clip_ratio_high is None else cfg.clip_ratio_high
    mode = cfg.policy_loss
    if mode == "vanilla":
        return ppo_clip_loss(logp_bt, old_logp_bt, adv_bt, low, high, clip_c=cfg.clip_ratio_c)
    if mode == "gspo":
        return gspo_loss(logp_bt, old_logp_bt, adv_bt, mask_bt, low, high)
    if mode == "clip_cov":
        return clip_cov_loss(
            logp_bt, old_logp_bt, adv_bt, mask_bt, low, high, clip_cov_ratio=cfg.clip_cov_ratio,
            clip_cov_lb=cfg.clip_cov_lb, clip_cov_ub=cfg.clip_cov_ub, generator=generator,
        )  # fmt: skip
    if mode == "kl_cov":
        return kl_cov_loss(
            logp_bt, old_logp_bt, adv_bt, mask_bt, kl_cov_ratio=cfg.kl_cov_ratio, ppo_kl_coef=cfg.ppo_kl_coef
        )
    raise ValueError(f"unknown policy loss {mode!r}; expected one of {', '.join(POLICY_LOSSES)}")


def selection_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from integer keys (trainer.seed, the update, the micro-batch, the data-parallel rank):
    the same keys draw the same tokens, so a resumed run repeats an uninterrupted one's draws."""
    return torch.Generator().manual_seed(hash(tuple(keys)) % 2**63)  # an int tuple's hash is not salted


def nll_loss(logp_bt: torch.Tensor) -> PolicyLossOut:
    """Supervised fine-tuning's loss (sft.enable): each trained token's negative log-likelihood, L = -log p; no
    ratio (1), nothing clipped. Aggregated as the policy loss is (actor.loss_agg_mode: token-mean is verl's and
    TRL's SFT loss)."""
    zeros = torch.zeros_like(logp_bt)
    return PolicyLossOut(-logp_bt, torch.ones_like(logp_bt), zeros, zeros, zeros)
