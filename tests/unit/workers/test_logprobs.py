"""Tests of torchrl_post/workers/logprobs.py: the packed and shared-prompt forwards equal the padded one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.unit.workers.helpers import CPU, RAGGED, _batch, _groups
from torchrl_post.workers.logprobs import batched_log_probs, packed_forward_log_probs, padded_forward_log_probs


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
