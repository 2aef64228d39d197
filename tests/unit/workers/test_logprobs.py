"""Tests of torchrl_post/workers/logprobs.py: the packed and shared-prompt forwards equal the padded one; with a
top-k / top-p truncation every forward gives the renormalised logprobs of `algos/sampling_support.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

from tests.unit.workers.helpers import CPU, RAGGED, _batch, _groups
from torchrl_post.algos.sampling_support import Truncation, support_log_probs
from torchrl_post.types import Batch
from torchrl_post.workers import logprobs
from torchrl_post.workers.logprobs import (
    batched_log_probs,
    forward_log_probs,
    packed_forward_log_probs,
    padded_forward_log_probs,
)
from torchrl_post.workers.micro_batches import plan_micro_batches


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_forward_equals_padded(model: torch.nn.Module, temperature: float) -> None:
    b = _batch(RAGGED)
    mask = b.loss_mask
    rows = slice(0, len(b))
    logp_a, ent_a, cells, _ = padded_forward_log_probs(model, b, rows, temperature, CPU)
    logp_b, ent_b, packed_cells, placed = packed_forward_log_probs(model, b, rows, temperature, CPU)
    assert placed == int(b.attention_mask.sum())  # every token placed once: no prompt shared
    assert int(b.attention_mask.sum()) <= packed_cells < cells  # less padding computed
    assert ((logp_a - logp_b) * mask).abs().max() < 2e-6
    assert ((ent_a - ent_b) * mask).abs().max() < 5e-6
    assert (logp_b * (1 - mask)).abs().max() == 0  # nothing outside the responses
    # the same gradients: a loss over the response tokens
    grads = []
    for logp in (padded_forward_log_probs, packed_forward_log_probs):
        model.zero_grad()
        (logp(model, b, rows, temperature, CPU)[0] * mask * torch.arange(1.0, 6.0)).sum().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    scale = max(g.abs().max().item() for g in grads[0].values())
    assert max((grads[0][k] - grads[1][k]).abs().max().item() for k in grads[0]) < 1e-6 * max(scale, 1.0)


def test_packed_samples_do_not_attend_across(model: torch.nn.Module) -> None:
    """A sample's logprobs are the same packed beside any other sample as packed alone."""
    b = _batch(RAGGED)
    alone = packed_forward_log_probs(model, b, torch.tensor([2]), 1.0, CPU)[0]
    for other in (0, 1, 3):
        both = packed_forward_log_probs(model, b, torch.tensor([other, 2]), 1.0, CPU)[0]
        assert (both[1] - alone[0]).abs().max() < 2e-6


def test_pack_with_no_response_tokens_keeps_a_graph(model: torch.nn.Module) -> None:
    b = _batch([(2, 5), (0, 5)])
    logp, ent, _, _ = packed_forward_log_probs(model, b, slice(0, 2), 1.0, CPU)
    assert logp.abs().sum() == 0 and logp.requires_grad
    logp.sum().backward()  # a stand-in micro-batch must still run backward (FSDP's reduce-scatter)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_shared_prefix_forward_equals_padded(tiny_model: Path, impl: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation=impl)
    b = _groups([0, 3, 5], [[1, 0, 3, 4], [2, 2, 0, 1], [0, 4, 3, 1]])  # the last group: an empty response
    mask, rows = b.loss_mask, slice(0, len(b))
    weights = torch.arange(1.0, 5.0)
    results = []
    for forward, kwargs in ((padded_forward_log_probs, {}), (packed_forward_log_probs, {"shared": True})):
        model.zero_grad()
        logp, ent, cells, _ = forward(model, b, rows, 1.0, CPU, **kwargs)
        (logp * mask * weights).sum().backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent, cells, grads))
    (la, ea, ca, ga), (lb, eb, cb, gb) = results
    flat = packed_forward_log_probs(model, b, rows, 1.0, CPU)[2]
    assert cb < flat < ca  # each group's prompt computed once: fewer cells than packing the samples apart
    assert ((la - lb) * mask).abs().max() < 2e-6 and ((ea - eb) * mask).abs().max() < 5e-6
    assert (lb * (1 - mask)).abs().max() == 0
    scale = max(g.abs().max().item() for g in ga.values())
    assert ga.keys() == gb.keys() and max((ga[k] - gb[k]).abs().max().item() for k in ga) < 1e-6 * max(scale, 1.0)


@pytest.mark.parametrize("packed", [False, True])
def test_batched_log_probs_hold_no_graph(model: torch.nn.Module, packed: bool) -> None:
    """Old and reference logprobs are constants of the update: a graph kept on them makes the update's backward
    run through the old forward (a KL-in-reward run failed in backward when the decorator went missing)."""
    model.train()
    out = batched_log_probs(model, _batch(RAGGED), 1.0, 2, CPU, packed=packed)
    assert not out.requires_grad and out.grad_fn is None
    assert out.abs().sum() > 0


def _maskless_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):  # type: ignore[no-untyped-def]
    """A CPU stand-in for flash-attn as transformers calls it: it takes no mask (transformers builds none for it),
    attends causally within each row, or within each `cu_seq_lens_q` sequence of the flattened rows when given."""
    b, heads, t, _ = query.shape
    key = key.repeat_interleave(heads // key.shape[1], dim=1)
    value = value.repeat_interleave(heads // value.shape[1], dim=1)
    seq = torch.zeros(b * t, dtype=torch.long)
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        seq[cu[1:-1].long()] = 1
        seq = seq.cumsum(0)
    else:
        seq = torch.arange(b).repeat_interleave(t)
    seq_bt = seq.view(b, t)
    allowed = (seq_bt[:, :, None] == seq_bt[:, None, :]) & torch.ones(t, t, dtype=torch.bool).tril()
    scores = (query @ key.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min)
    return (scores.softmax(-1) @ value).transpose(1, 2).contiguous(), None


def test_packed_rows_without_a_mask_keep_samples_apart(
    model: torch.nn.Module, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k > 1 packed rows through an attention that takes no mask (flash-attn's case) equal the padded forward:
    the rows carry their sequence boundaries. Without them, the samples of a row see each other."""
    from transformers import AttentionInterface

    from torchrl_post.workers.packing import Pack, pack

    AttentionInterface.register("maskless_stand_in", _maskless_attention)
    maskless = AutoModelForCausalLM.from_pretrained(
        tiny_model, dtype=torch.float32, attn_implementation="maskless_stand_in"
    )
    b = _groups([0, 3, 5], [[1, 0, 3, 4], [2, 2, 0, 1], [0, 4, 3, 1]])
    rows, mask = slice(0, len(b)), b.loss_mask
    p = pack(b, rows)
    assert 1 < p.ids.shape[0] < len(p.varlen(CPU)["cu_seq_lens_q"]) - 1  # k > 1 rows, some holding several samples
    padded = padded_forward_log_probs(model, b, rows, 1.0, CPU)[0].detach()  # sdpa with its mask: the truth
    packed = packed_forward_log_probs(maskless, b, rows, 1.0, CPU, shared=True)[0].detach()
    assert ((padded - packed) * mask).abs().max() < 2e-6
    monkeypatch.setattr(Pack, "varlen", lambda self, device: {})  # the rows without their boundaries (before)
    crossed = packed_forward_log_probs(maskless, b, rows, 1.0, CPU, shared=True)[0].detach()
    assert ((padded - crossed) * mask).abs().max() > 1e-2


def _reference_log_probs(model: torch.nn.Module, b: Batch, temperature: float, truncation: Truncation | None) -> Tensor:
    """log p(response token) [B, R] straight from the model's full logits: the pure function on them."""
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    r = b.response_width
    z = logits[:, -r - 1 : -1].float() / temperature
    labels = b.input_ids[:, -r:]
    logp_all = torch.log_softmax(z, -1) if truncation is None else support_log_probs(z, truncation, labels)
    return logp_all.gather(-1, labels[..., None]).squeeze(-1)


@pytest.mark.parametrize("truncation", [Truncation(top_k=8), Truncation(top_p=0.3), Truncation(top_k=40, top_p=0.5)])
def test_truncated_log_probs_are_the_pure_function_of_the_logits(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, truncation: Truncation
) -> None:
    """With a truncation, every forward (padded and packed; the chunked head and the full logits) gives
    `support_log_probs` of the model's own logits; without one, the full log-softmax, as before. The entropy is
    the full distribution's either way."""
    b = _batch(RAGGED)
    rows, mask, t = slice(0, len(b)), b.loss_mask, 0.7
    want_on = _reference_log_probs(model, b, t, truncation)
    want_off = _reference_log_probs(model, b, t, None)
    assert ((want_on - want_off) * mask).abs().max() > 0.1  # the truncation matters on these tokens
    for chunk in (0, 3):
        monkeypatch.setattr(logprobs, "HEAD_CHUNK_TOKENS", chunk)
        for forward in (padded_forward_log_probs, packed_forward_log_probs):
            on, ent_on, *_ = forward(model, b, rows, t, CPU, truncation=truncation)
            off, ent_off, *_ = forward(model, b, rows, t, CPU)
            assert ((on - want_on) * mask).abs().max() < 2e-5, (chunk, forward)
            assert ((off - want_off) * mask).abs().max() < 2e-5, (chunk, forward)
            assert ((ent_on - ent_off) * mask).abs().max() == 0


def test_ratio_of_identical_policies_is_one_under_top_p(model: torch.nn.Module) -> None:
    """The old logprobs (no graph, `batched_log_probs`) and the update's (`forward_log_probs` with its graph) of
    the same weights on the same tokens: exp(new - old) is 1 on every response token."""
    b = _batch(RAGGED)
    truncation = Truncation(top_p=0.3)
    old = batched_log_probs(model, b, 0.7, len(b), CPU, truncation=truncation)
    plan = plan_micro_batches(b.attention_mask, b.response_width, len(b), 0, False, None, CPU)
    new = forward_log_probs(model, b, plan[0], 0.7, CPU, packed=False, truncation=truncation)[0]
    ratio = torch.exp(new.detach() - old) * b.loss_mask + (1 - b.loss_mask)
    assert torch.equal(ratio, torch.ones_like(ratio))
