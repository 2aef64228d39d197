"""Tests of torchrl_post/workers/lm_head.py and its use in workers/logprobs.py: the chunked head equals the
full-logits log-softmax (values and every gradient), and a model's forward gives the same logprobs either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.unit.workers.helpers import CPU, RAGGED, _batch
from torchrl_post.algos.sampling_support import Truncation, support_log_probs
from torchrl_post.workers import logprobs
from torchrl_post.workers.lm_head import chunked_log_probs, chunked_top_k
from torchrl_post.workers.logprobs import (
    Score,
    logits_to_logprobs,
    packed_forward_log_probs,
    padded_forward_log_probs,
)


def _full(hidden, weight, bias, labels, temperature, never, truncation):  # type: ignore[no-untyped-def]
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return logits_to_logprobs(logits, labels, temperature, never, truncation)


@pytest.mark.parametrize(
    ("temperature", "never", "chunk", "truncation"),
    [
        (1.0, (), 3, None),
        (0.7, (5, 9), 4, None),
        (0.0, (), 100, None),
        (0.7, (5, 9), 4, Truncation(top_k=5)),
        (1.0, (), 3, Truncation(top_p=0.6)),
        (0.8, (), 100, Truncation(top_k=20, top_p=0.7)),
    ],
)
@pytest.mark.parametrize("entropy_in_loss", [True, False])
def test_chunked_head_equals_full_logits(
    temperature: float, never: tuple[int, ...], chunk: int, truncation: Truncation | None, entropy_in_loss: bool
) -> None:
    """Values and gradients; with a truncation, log p(label) renormalised on the kept set (labels drawn at random
    fall outside it often, so the label's inclusion is exercised) while the entropy stays the full one. The chunks
    whose logits the forward keeps for the backward (`keep`: none, the first two chunks, all) give exactly what
    recomputed chunks give."""
    gen = torch.Generator().manual_seed(0)
    n, h, v = 11, 8, 37
    leaves = [torch.randn(n, h, generator=gen), torch.randn(v, h, generator=gen), torch.randn(v, generator=gen)]
    labels = torch.randint(0, v, (n,), generator=gen)
    g_logp, g_ent = torch.randn(n, generator=gen), torch.randn(n, generator=gen)  # a loss using both outputs
    results = []
    for keep in (None, 0, 2 * chunk, n):  # None: the full logits
        xs = [t.clone().requires_grad_() for t in leaves]
        if keep is not None:
            logp, ent = chunked_log_probs(
                xs[0], xs[1], xs[2], labels, temperature, never, -1e4, chunk, truncation, keep
            )  # fmt: skip
        else:
            logp, ent = _full(*xs, labels, temperature, never, truncation)
        # without the entropy in the loss its gradient reaches the head as None and its backward term is skipped
        ((logp * g_logp).sum() + ((ent * g_ent).sum() if entropy_in_loss else 0)).backward()
        results.append([logp.detach(), ent.detach(), *(x.grad for x in xs)])
    for name, a, b, *kept in zip(("logp", "entropy", "d hidden", "d weight", "d bias"), *results, strict=True):
        assert a is not None and b is not None
        assert (a - b).abs().max() < 1e-5 * max(1.0, a.abs().max().item()), name
        assert all(torch.equal(b, k) for k in kept), name


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


def test_model_forward_chunked_equals_full_logits(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """Padded and packed forwards through the chunked head (3 positions per pass) equal the full logits' path:
    logprobs, entropy, and the gradients of a loss that uses both (the head's weight included)."""
    assert logprobs._linear_head(model) is model.lm_head  # the chunked pass applies to this model
    b = _batch(RAGGED)
    rows, mask = slice(0, len(b)), b.loss_mask
    for forward in (padded_forward_log_probs, packed_forward_log_probs):
        out = []
        for chunk in (0, 3):
            monkeypatch.setattr(logprobs, "HEAD_CHUNK_TOKENS", chunk)
            model.zero_grad()
            logp, ent, *_ = forward(model, b, rows, 0.7, CPU)
            ((logp - 0.1 * ent) * mask * torch.arange(1.0, 6.0)).sum().backward()
            grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
            out.append((logp.detach() * mask, ent.detach() * mask, grads))
        (la, ea, ga), (lb, eb, gb) = out
        assert (la - lb).abs().max() < 2e-6 and (ea - eb).abs().max() < 5e-6
        assert ga.keys() == gb.keys() and any("embed" in k or "lm_head" in k for k in ga)
        scale = max(g.abs().max().item() for g in ga.values())
        assert max((ga[k] - gb[k]).abs().max().item() for k in ga) < 1e-6 * max(scale, 1.0)


def test_bf16_head_weight_gradient_rounded_once_over_many_chunks() -> None:
    """A bf16 head over 128 chunks of 16 positions (a 4,096-token vocabulary, logits of std 8): the weight's
    gradient is the exact float64 sum of the chunks' bf16 products to about one final bf16 rounding, where summing
    them in bf16 chunk after chunk (the backward's old accumulator, rebuilt here with the same ops) is ~3x off."""
    gen = torch.Generator().manual_seed(0)
    n, h, v, chunk = 2048, 64, 4096, 16
    hidden = torch.randn(n, h, generator=gen).bfloat16()
    weight = torch.randn(v, h, generator=gen).bfloat16()
    labels = torch.randint(0, v, (n,), generator=gen)
    w = weight.clone().requires_grad_()
    logp, _ = chunked_log_probs(hidden, w, None, labels, 1.0, chunk=chunk)
    logp.sum().backward()
    assert w.grad is not None and w.grad.dtype == torch.bfloat16
    exact, per_chunk = torch.zeros(v, h, dtype=torch.float64), torch.zeros(v, h, dtype=torch.bfloat16)
    for s in range(0, n, chunk):  # d log p(label) / dz = onehot(label) - p, in bf16 as the backward forms it
        hc, z = hidden[s : s + chunk], torch.nn.functional.linear(hidden[s : s + chunk], weight).float()
        p = (z - z.logsumexp(-1, keepdim=True)).exp()
        gz = (torch.nn.functional.one_hot(labels[s : s + chunk], v).float() - p).bfloat16()
        exact += gz.double().t() @ hc.double()
        per_chunk.addmm_(gz.t(), hc)
    new, once, old = ((x.double() - exact).abs().max().item() for x in (w.grad, exact.bfloat16(), per_chunk))
    assert new <= 2 * once and 2 * new < old, (new, once, old)


@pytest.mark.parametrize(
    ("chunk", "truncation"), [(3, None), (64, None), (3, Truncation(top_k=4)), (64, Truncation(top_p=0.5))]
)
def test_several_labels_per_position_equal_the_full_log_softmax_and_its_gradient(
    chunk: int, truncation: Truncation | None
) -> None:
    """labels [N, k] (the sampled token, then a teacher's top-k ids): log p of each, values and gradients
    (through the hidden states, the head's weight and bias, with the entropy in the loss too) equal autograd through
    the full logits' log_softmax gathered at the k ids; with a truncation the first label's log p is the kept set's
    (`support_log_probs`, as one label's is) and the others' stay the full distribution's."""
    gen = torch.Generator().manual_seed(1)
    n, h, v, k = 9, 8, 29, 5
    leaves = [torch.randn(n, h, generator=gen), torch.randn(v, h, generator=gen), torch.randn(v, generator=gen)]
    labels = torch.stack([torch.randperm(v, generator=gen)[:k] for _ in range(n)])  # distinct ids per position
    g_logp, g_ent = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    results = []
    for chunked in (False, True):
        xs = [t.clone().requires_grad_() for t in leaves]
        if chunked:
            logp, ent = chunked_log_probs(xs[0], xs[1], xs[2], labels, 0.7, chunk=chunk, truncation=truncation)
        else:
            z = torch.nn.functional.linear(xs[0], xs[1], xs[2]) / 0.7
            logq = torch.log_softmax(z, -1)
            logp, ent = logq.gather(-1, labels), -(logq.exp() * logq).sum(-1)
            if truncation is not None:
                first = support_log_probs(z, truncation, labels[:, 0]).gather(-1, labels[:, :1])
                assert (first - logp[:, :1] > 1e-3).any()  # the renormalisation shows
                logp = torch.cat([first, logp[:, 1:]], -1)
        ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
        results.append([logp.detach(), ent.detach(), *(x.grad for x in xs)])
    assert results[1][0].shape == (n, k)
    for name, a, b in zip(("logp", "entropy", "d hidden", "d weight", "d bias"), *results, strict=True):
        assert a is not None and b is not None
        assert (a - b).abs().max() < 1e-5 * max(1.0, a.abs().max().item()), name


def test_top_k_is_the_full_log_softmax_top_k_chunk_by_chunk() -> None:
    gen = torch.Generator().manual_seed(2)
    n, h, v, k = 13, 8, 31, 4
    hidden, weight, bias = (
        torch.randn(n, h, generator=gen),
        torch.randn(v, h, generator=gen),
        torch.randn(v, generator=gen),
    )
    logq = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias) / 0.8, -1)
    want, want_ids = logq.topk(k, dim=-1)
    got, ids = chunked_top_k(hidden, weight, bias, k, 0.8, chunk=5)
    assert torch.equal(ids, want_ids) and (got - want).abs().max() < 1e-5
    # and the student's head scores exactly those ids: the same model gives the same numbers
    again, _ = chunked_log_probs(hidden, weight, bias, ids, 0.8, chunk=5)
    assert (again - got).abs().max() < 1e-6


def test_a_teachers_top_k_and_a_students_log_p_of_those_ids_in_every_layout(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """forward_kl_topk's two forwards (`Score`), padded and packed, chunked head and full logits, against the
    model's own logits: the teacher's top-k [B, R, k, 2] (log p, id) at each response position, and the student's
    log p of the sampled token and of those k ids [B, R, 1 + k]."""
    b, temperature, k = _batch(RAGGED), 0.7, 4
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    p = b.prompt_width
    logq = torch.log_softmax(logits[:, p - 1 : -1].float() / temperature, -1)  # [B, R, V]: predicting each response
    want_lp, want_ids = logq.topk(k, dim=-1)
    sampled = logq.gather(-1, b.responses[..., None]).squeeze(-1)
    real = b.response_mask.bool()
    assert real.sum() > 10
    for forward in (padded_forward_log_probs, packed_forward_log_probs):
        for chunk in (0, 3):
            monkeypatch.setattr(logprobs, "HEAD_CHUNK_TOKENS", chunk)
            with torch.no_grad():
                top = forward(model, b, slice(0, len(b)), temperature, CPU, score=Score(top_k=k))[0]
                both = forward(model, b, slice(0, len(b)), temperature, CPU, score=Score(labels=want_ids))[0]
            assert top.shape == (*b.loss_mask.shape, k, 2) and both.shape == (*b.loss_mask.shape, 1 + k)
            assert torch.equal(top[real][..., 1].long(), want_ids[real]), (forward.__name__, chunk)
            assert (top[real][..., 0] - want_lp[real]).abs().max() < 2e-6
            assert (both[real][:, 0] - sampled[real]).abs().max() < 2e-6
            assert (both[real][:, 1:] - want_lp[real]).abs().max() < 2e-6
