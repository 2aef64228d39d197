"""Tests of torchrl_post/algos/sampling_support.py: the top-k / top-p kept set and the log-probabilities
renormalised on it, against numbers worked out by hand on a 5-token vocabulary and against vLLM's own masking."""

from __future__ import annotations

import math

import pytest
import torch

from torchrl_post.algos.sampling_support import Truncation, support_log_probs, support_threshold

LN = math.log
INF = math.inf
# Logits whose softmax is p = (0.4, 0.3, 0.15, 0.1, 0.05): tokens 0..4 from most to least likely.
P = [0.4, 0.3, 0.15, 0.1, 0.05]
LOGITS = torch.tensor([LN(x) for x in P])


def _lp(truncation: Truncation, label: int | None = None, logits: torch.Tensor = LOGITS) -> list[float]:
    labels = None if label is None else torch.tensor(label)
    return support_log_probs(logits, truncation, labels).tolist()


def _close(got: list[float], want: list[float]) -> None:
    assert [g == -INF for g in got] == [w == -INF for w in want], (got, want)
    assert got == pytest.approx([w if w != -INF else g for g, w in zip(got, want, strict=True)], abs=1e-6)


def test_no_truncation_is_the_full_log_softmax() -> None:
    _close(_lp(Truncation()), [LN(x) for x in P])
    _close(_lp(Truncation(top_k=5)), [LN(x) for x in P])  # k = V keeps everything
    _close(_lp(Truncation(top_k=9)), [LN(x) for x in P])  # k > V as well


def test_top_k_renormalises_over_the_k_largest() -> None:
    # top_k=2 keeps {0, 1}, mass 0.7: 0.4 / 0.7 = 4/7, 0.3 / 0.7 = 3/7.
    _close(_lp(Truncation(top_k=2)), [LN(4 / 7), LN(3 / 7), -INF, -INF, -INF])


def test_top_p_keeps_the_smallest_head_reaching_p() -> None:
    # Ascending 0.05, 0.1, 0.15, 0.3, 0.4; cumulative 0.05, 0.15, 0.30, 0.60, 1.0. top_p=0.8 drops cumulative
    # <= 0.2: tokens 4 and 3. Kept {0, 1, 2}, mass 0.85 (0.4 + 0.3 = 0.7 < 0.8 needs token 2):
    # 0.4 / 0.85 = 8/17, 0.3 / 0.85 = 6/17, 0.15 / 0.85 = 3/17.
    _close(_lp(Truncation(top_p=0.8)), [LN(8 / 17), LN(6 / 17), LN(3 / 17), -INF, -INF])
    # Either side of the boundary 0.7 = 0.4 + 0.3: top_p=0.69 drops cumulative <= 0.31 (token 2's 0.30 too), so
    # {0, 1} (4/7, 3/7); top_p=0.71 drops <= 0.29 and keeps token 2 again.
    _close(_lp(Truncation(top_p=0.69)), [LN(4 / 7), LN(3 / 7), -INF, -INF, -INF])
    _close(_lp(Truncation(top_p=0.71)), [LN(8 / 17), LN(6 / 17), LN(3 / 17), -INF, -INF])
    # A tiny top_p keeps the largest alone: log 1 = 0.
    _close(_lp(Truncation(top_p=0.01)), [0.0, -INF, -INF, -INF, -INF])


def test_top_p_applies_to_the_top_k_set_renormalised() -> None:
    # top_k=3 keeps {0, 1, 2} (mass 0.85): 8/17, 6/17, 3/17 = 0.471, 0.353, 0.176. top_p=0.8 over those: 8/17 +
    # 6/17 = 14/17 = 0.824 >= 0.8, so {0, 1} (over the full distribution, 0.7 < 0.8 would keep token 2 too).
    _close(_lp(Truncation(top_k=3, top_p=0.8)), [LN(4 / 7), LN(3 / 7), -INF, -INF, -INF])


def test_the_sampled_token_is_always_in_the_support() -> None:
    # top_k=2 keeps {0, 1}; label 3 (p 0.1) joins: mass 0.8, so 0.4 / 0.8 = 1/2, 0.3 / 0.8 = 3/8, 0.1 / 0.8 = 1/8.
    _close(_lp(Truncation(top_k=2), label=3), [LN(1 / 2), LN(3 / 8), -INF, LN(1 / 8), -INF])
    # A label inside the set changes nothing.
    _close(_lp(Truncation(top_k=2), label=1), [LN(4 / 7), LN(3 / 7), -INF, -INF, -INF])


def test_ties_at_the_kth_logit_are_all_kept() -> None:
    # Logits (2, 1, 1, 0, -1), top_k=2: the 2nd largest is 1, held by tokens 1 and 2, so both are kept (vLLM's
    # `logits < kth` mask). Normaliser e^2 + 2e: log p0 = -log(1 + 2/e), log p1 = log p2 = -log(e + 2).
    logits = torch.tensor([2.0, 1.0, 1.0, 0.0, -1.0])
    want = [-LN(1 + 2 / math.e), -LN(math.e + 2), -LN(math.e + 2), -INF, -INF]
    _close(_lp(Truncation(top_k=2), logits=logits), want)


def test_rows_and_threshold_shapes() -> None:
    # [2, 3, 5] logits: each row's threshold is its own (row 0: the 2nd largest; row 1's reversed logits too).
    logits = torch.stack([LOGITS, LOGITS.flip(-1)]).unsqueeze(1).expand(2, 3, 5)
    thr = support_threshold(logits, Truncation(top_k=2))
    assert thr.shape == (2, 3, 1)
    assert torch.allclose(thr, torch.full((2, 3, 1), LN(0.3)))
    labels = torch.tensor([[0, 1, 4], [4, 3, 0]])
    lp = support_log_probs(logits, Truncation(top_k=2), labels)
    assert lp.shape == (2, 3, 5)
    assert lp[0, 2, 4].item() == pytest.approx(LN(0.05 / 0.75))  # an out-of-set label joins its own row only
    assert lp[0, 0, 4].item() == -INF


def test_ratio_of_identical_policies_is_exactly_one_under_top_p() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 7, 50) * 3
    labels = torch.randint(0, 50, (4, 7))
    t = Truncation(top_p=0.9)
    old = support_log_probs(logits, t, labels).gather(-1, labels[..., None])
    new = support_log_probs(logits.clone().requires_grad_(), t, labels).gather(-1, labels[..., None])
    assert torch.equal(torch.exp(new - old), torch.ones_like(old))
    assert torch.isfinite(new).all()


def test_gradient_is_onehot_minus_the_renormalised_probabilities() -> None:
    # d log pi_S(y) / dz = onehot(y) - pi_S: label 0 under top_k=2: (1 - 4/7, -3/7, 0, 0, 0).
    z = LOGITS.clone().requires_grad_()
    support_log_probs(z, Truncation(top_k=2), torch.tensor(0))[0].backward()
    assert z.grad is not None
    assert z.grad.tolist() == pytest.approx([3 / 7, -3 / 7, 0.0, 0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize(("k", "p"), [(0, 0.9), (7, 1.0), (7, 0.8), (30, 0.5)])
def test_equals_vllm_processed_logprobs(k: int, p: float) -> None:
    """vLLM's own masking then log_softmax, as logprobs_mode=processed_logprobs returns it, equals the
    renormalised logprobs token for token: the PyTorch path its CPU and native samplers take (without Triton),
    top-k alone through `apply_top_k_only` as on CPU."""
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    torch.manual_seed(1)
    logits = torch.randn(16, 64) * 2 / 0.7  # tempered
    k_b = torch.full((16,), k if k else 64, dtype=torch.long)
    p_b = torch.full((16,), p) if p < 1 else None
    processed = ops.apply_top_k_top_p_pytorch(logits.clone(), k_b if k else None, p_b, allow_cpu_sync=True).log_softmax(
        dim=-1
    )
    ours = support_log_probs(logits, Truncation(top_k=k, top_p=p))
    assert torch.equal(torch.isinf(processed), torch.isinf(ours))
    kept = torch.isfinite(processed)
    assert torch.allclose(processed[kept], ours[kept], atol=1e-6)
    # vLLM samples inside its set, so adding the sampled token changes nothing.
    sampled = processed.exp().multinomial(1).squeeze(-1)
    assert torch.equal(support_log_probs(logits, Truncation(top_k=k, top_p=p), sampled), ours)
