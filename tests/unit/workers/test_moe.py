"""Tests of torchrl_post/workers/moe.py and the MoE routing through the logprob forwards: the router's top-k and
load-balancing loss equal transformers', replayed experts are the ones computed, and the recorded experts reach
the same cells padded, packed and with shared prompts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_moe import modeling_qwen3_moe

from tests.unit.workers.helpers import CPU, RAGGED, _batch, _groups
from torchrl_post.engines.batch import pad_samples
from torchrl_post.types import Batch
from torchrl_post.workers.logprobs import MoeForward, packed_forward_log_probs, padded_forward_log_probs
from torchrl_post.workers.moe import RouteTrace, load_balancing_loss, route_top_k, routers, routing
from torchrl_post.workers.packing import pack


@pytest.fixture(scope="module")
def moe(tiny_moe_model: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32)
    with torch.no_grad():  # the saved router is all zeros (ties everywhere): give it real preferences
        gen = torch.Generator().manual_seed(1)
        for r in routers(model):
            r.weight.copy_(0.3 * torch.randn(r.weight.shape, generator=gen))
    return model


def test_route_top_k_equals_the_hf_router(moe: torch.nn.Module) -> None:
    router = routers(moe)[0]
    h = torch.randn(10, router.weight.shape[1], generator=torch.Generator().manual_seed(0))
    logits, scores, indices = router(h)
    weights, used, own = route_top_k(logits, router.top_k, router.norm_topk_prob)
    assert torch.equal(used, indices) and torch.equal(own, indices)
    assert torch.allclose(weights, scores, atol=1e-7)
    # replay: a row with a record uses it, a row with -1 keeps the router's own choice
    replay = torch.full((10, 2), -1)
    replay[3] = torch.tensor([(int(indices[3, 0]) + 1) % 4, (int(indices[3, 0]) + 2) % 4])
    weights, used, _ = route_top_k(logits, router.top_k, router.norm_topk_prob, replay)
    assert torch.equal(used[3], replay[3]) and torch.equal(used[:3], indices[:3])
    probs = logits[3].softmax(-1)[replay[3]]
    assert torch.allclose(weights[3], probs / probs.sum() if router.norm_topk_prob else probs, atol=1e-7)
    weights, _, _ = route_top_k(logits, router.top_k, True, replay)
    assert torch.allclose(weights[3], probs / probs.sum(), atol=1e-7)


def test_load_balancing_loss_equals_transformers() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(2 * 6, 4, generator=gen) for _ in range(3)]  # 3 layers of [batch 2 x 6 tokens, 4 experts]
    used = [torch.topk(x.softmax(-1), 2, -1).indices for x in logits]
    ours = load_balancing_loss(logits, used, 4)
    theirs = modeling_qwen3_moe.load_balancing_loss_func(tuple(logits), 4, 2)
    assert torch.allclose(ours, theirs, atol=1e-6)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # padding leaves the counts
    ours = load_balancing_loss(logits, used, 4, mask.reshape(-1).bool())
    theirs = modeling_qwen3_moe.load_balancing_loss_func(tuple(logits), 4, 2, mask)
    assert torch.allclose(ours, theirs, atol=1e-6)
    balanced = [torch.zeros(8, 4)]  # every expert as likely, each picked by a quarter of each slot
    picks = [torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0]] * 2)]
    assert torch.allclose(load_balancing_loss(balanced, picks, 4), torch.tensor(2.0))


def _expert(block: torch.nn.Module, e: int, h: torch.Tensor) -> torch.Tensor:
    """Expert e of a Qwen3-MoE block on hidden states [N, H], by hand."""
    ex = block.experts
    gate, up = (h @ ex.gate_up_proj[e].T).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up) @ ex.down_proj[e].T


def test_a_replayed_token_is_computed_with_the_recorded_experts(moe: torch.nn.Module) -> None:
    block = moe.model.layers[0].mlp
    h = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(2))
    logits, _, own = block.gate(h.view(-1, 64))
    replay = torch.full((5, 1, 2), -1)
    other = [e for e in range(4) if e not in own[2].tolist()]  # token 2 gets the two experts its router did not pick
    replay[2, 0] = torch.tensor(other)
    trace = RouteTrace()
    with torch.no_grad(), routing(block, trace, replay):
        out = block(h).view(5, 64)
        plain_router = block.gate(h.view(-1, 64))  # still replayed inside the context
    probs = logits[2].softmax(-1)[other]
    weights = probs / probs.sum() if block.gate.norm_topk_prob else probs
    by_hand = sum(w * _expert(block, e, h.view(-1, 64)[2:3])[0] for w, e in zip(weights, other, strict=True))
    assert torch.allclose(out[2], by_hand, atol=1e-6)
    with torch.no_grad():
        plain = block(h).view(5, 64)  # the router's own experts again after the context
    assert not torch.allclose(plain[2], out[2], atol=1e-4)
    assert torch.allclose(plain[[0, 1, 3, 4]], out[[0, 1, 3, 4]], atol=1e-6)  # unrecorded tokens: their own
    assert torch.equal(plain_router[2][2], torch.tensor(other))
    differ, decisions = trace.disagreement()
    assert (differ.item(), decisions.item()) == (1.0, 1.0)  # one token recorded, its set differs
    # the router still learns under replay: the gate weights come from its logits
    block.zero_grad()
    with routing(block, None, replay):
        block(h).sum().backward()
    assert block.gate.weight.grad is not None and block.gate.weight.grad.abs().sum() > 0


def _recorded(b: Batch, layers: int, seed: int = 0) -> Batch:
    """`b` with random recorded experts (2 distinct of 4) at every real token, -1 elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    n, width = b.input_ids.shape
    first = torch.randint(0, 4, (n, layers, 1, width), generator=gen)
    second = (first + torch.randint(1, 4, first.shape, generator=gen)) % 4
    routes = torch.cat([first, second], 2).to(torch.int16)
    routes[b.attention_mask[:, None, None, :].expand_as(routes) == 0] = -1
    return replace(b, routed_experts=routes)


@pytest.mark.parametrize("shared", [False, True])
def test_replayed_packed_forward_equals_padded(moe: torch.nn.Module, shared: bool) -> None:
    """The recorded experts reach each token through packing (and shared prompts) as through padding; with
    replay the logprobs move away from the router's own, by the same amounts in every layout."""
    b = _recorded(_groups([0, 2], [[0, 1, 2], [3, 0, 1]]) if shared else _batch(RAGGED), layers=2)
    if shared:  # the engine routes a prompt's tokens alike in each of its samples
        assert b.routed_experts is not None
        for first in (0, 3):
            b.routed_experts[first + 1 : first + 3, ..., : b.prompt_width] = b.routed_experts[
                first, ..., : b.prompt_width
            ]
    rows = slice(0, len(b))
    mask = b.loss_mask
    with torch.no_grad():
        plain = padded_forward_log_probs(moe, b, rows, 1.0, CPU)[0]
        traces = [RouteTrace(), RouteTrace()]
        padded = padded_forward_log_probs(moe, b, rows, 1.0, CPU, moe=MoeForward(True, traces[0]))[0]
        packed = packed_forward_log_probs(moe, b, rows, 1.0, CPU, shared, moe=MoeForward(True, traces[1]))[0]
    assert ((padded - packed) * mask).abs().max() < 2e-6
    assert ((padded - plain) * mask).abs().max() > 1e-3  # random experts change the logprobs
    counts = [t.disagreement() for t in traces]
    assert counts[0][1] > 0 and counts[0][0] > 0
    if not shared:  # (a shared prompt's tokens are computed once, not once per sample)
        assert [c.item() for c in counts[0]] == [c.item() for c in counts[1]]
        assert torch.allclose(traces[0].aux_loss(), traces[1].aux_loss(), atol=1e-5)


def test_pack_source_places_every_token_cell(moe: torch.nn.Module) -> None:
    for b, shared in ((_batch(RAGGED), False), (_groups([0, 2], [[0, 1, 2], [3, 0, 1]]), True)):
        p = pack(b, slice(0, len(b)), shared)
        real = p.source >= 0
        assert torch.equal(b.input_ids.reshape(-1)[p.source[real]], p.ids[real])
        assert int(real.sum()) == p.tokens


def test_routes_are_laid_under_the_tokens_they_routed() -> None:
    """`pad_samples` puts a sample's route rows (positions 0 .. tokens-2) under its left-padded prompt and its
    response; `Batch.concat` and `trimmed` keep them aligned and pad with -1."""
    prompts, responses = [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]]
    routes = [torch.arange(4 * 2 * 2).view(4, 2, 2).to(torch.int16), 100 + torch.arange(3 * 4).view(3, 2, 2)]
    b = pad_samples(prompts, responses, [[0.0] * 2, [0.0] * 3], [[1.0] * 2, [1.0] * 3], [0, 1], ["stop"] * 2, 0, routes)
    assert b.routed_experts is not None and b.routed_experts.shape == (2, 2, 2, 3 + 3)
    assert torch.equal(b.routed_experts[0, :, :, :4], routes[0].permute(1, 2, 0))
    assert (b.routed_experts[0, :, :, 4:] == -1).all()  # the last token routes nothing kept
    assert torch.equal(b.routed_experts[1, :, :, 2:5], routes[1].to(torch.int16).permute(1, 2, 0))
    assert (b.routed_experts[1, :, :, :2] == -1).all()
    wide = Batch.concat([b.select(slice(1, 2)).trimmed(), b.select(slice(0, 1)).trimmed()], pad_id=0)
    assert wide.routed_experts is not None
    assert torch.equal(wide.routed_experts[1], b.routed_experts[0])
    assert torch.equal(wide.routed_experts[0], b.routed_experts[1])
    back = Batch.from_wire(b.to_wire())
    assert back.routed_experts is not None and torch.equal(back.routed_experts, b.routed_experts)
