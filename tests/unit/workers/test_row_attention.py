"""Tests of torchrl_post/workers/row_attention.py and `Pack.trimmed`: a pack whose rows have slack, run as one flat
row without it (attention row by row), equals the batched [k, T] forward at every response token, forward and
backward, with and without shared prompts, for the model families the trainer runs (Qwen2, Llama, a value head)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig, LlamaForCausalLM

from tests.unit.workers.helpers import CPU, RAGGED, _batch, _groups
from torchrl_post.types import Batch
from torchrl_post.workers.packing import Pack, pack
from torchrl_post.workers.row_attention import KEY


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(cfg).float()


def _outputs(model: torch.nn.Module, p: Pack) -> torch.Tensor:
    """The model's outputs (logits, or values) at the column predicting each response token, [N, ...]."""
    return p.full(model(**p.inputs(CPU, "sdpa")).logits)


def _batches() -> list[tuple[Batch, bool]]:
    shared = _groups([0, 3, 5], [[1, 0, 3, 4], [2, 2, 0, 1], [0, 4, 3, 1]])
    return [(_batch(RAGGED), False), (shared, False), (shared, True)]


@pytest.mark.parametrize("family", ["qwen2", "llama", "value"])
@pytest.mark.parametrize("case", [0, 1, 2])
def test_flat_pack_equals_batched_rows(tiny_model: Path, family: str, case: int) -> None:
    b, shared = _batches()[case]
    if family == "llama":
        model = _llama()
    elif family == "value":
        model = AutoModelForTokenClassification.from_pretrained(tiny_model, dtype=torch.float32, num_labels=1)
    else:
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    p = pack(b, slice(0, len(b)), shared)
    flat = p.trimmed()
    assert p.ids.shape[0] > 1 and p.cells > p.tokens  # rows with slack
    assert flat.ids.shape[0] == 1 and flat.cells == flat.tokens == p.tokens and sum(flat.rows) == p.tokens
    assert torch.equal(flat.labels, p.labels) and torch.equal(flat.ids[0, flat.out_col], p.ids[p.out_row, p.out_col])
    weights = torch.randn(len(p.labels), generator=torch.Generator().manual_seed(0))
    results = []
    for q in (p, flat):
        model.zero_grad()
        out = _outputs(model, q)
        (out.float().logsumexp(-1) * weights).sum().backward()
        results.append((out.detach(), {k: w.grad.clone() for k, w in model.named_parameters() if w.grad is not None}))
    (a, ga), (c, gc) = results
    assert a.shape == c.shape and (a - c).abs().max() < 2e-5
    scale = max(g.abs().max().item() for g in ga.values())
    assert ga.keys() == gc.keys() and max((ga[k] - gc[k]).abs().max().item() for k in ga) < 1e-5 * max(scale, 1.0)


def test_flat_pack_under_gradient_checkpointing(tiny_model: Path) -> None:
    """A checkpointed layer's recomputation in the backward attends row by row too (the plan is in its saved
    keyword arguments): the gradients equal those of the batched rows."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    b = _groups([0, 3, 5], [[1, 0, 3, 4], [2, 2, 0, 1], [0, 4, 3, 1]])
    p = pack(b, slice(0, len(b)), True)
    grads = []
    for q in (p, p.trimmed()):
        model.zero_grad()
        _outputs(model, q).float().logsumexp(-1).sum().backward()
        grads.append({k: w.grad.clone() for k, w in model.named_parameters() if w.grad is not None})
    scale = max(g.abs().max().item() for g in grads[0].values())
    assert max((grads[0][k] - grads[1][k]).abs().max().item() for k in grads[0]) < 1e-5 * max(scale, 1.0)


def test_flat_pack_varlen_boundaries() -> None:
    """A flat pack's varlen sequences (flash-attn) are its samples exactly: no slack run, a row start a start."""
    b = _batch(RAGGED)
    p = pack(b, slice(0, len(b)))
    flat = p.trimmed()
    lengths = b.attention_mask.sum(1)
    cu = flat.varlen(CPU)["cu_seq_lens_q"]
    assert int(cu[-1]) == int(lengths.sum()) and sorted(cu.diff().tolist()) == sorted(lengths.tolist())


def test_plan_reaches_the_attention(tiny_model: Path) -> None:
    """The flat inputs carry the plan and an empty mask: a forward that lost the plan fails instead of attending
    across rows."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    b = _batch(RAGGED)
    inputs = pack(b, slice(0, len(b))).trimmed().inputs(CPU, "sdpa")
    assert inputs["attention_mask"].shape == (1, 1, 0, 0)
    del inputs[KEY]
    with pytest.raises(RuntimeError):
        model(**inputs)


def test_blockwise_packing_shares_every_prompt_and_equals_separate_samples(tiny_model: Path) -> None:
    """Long answers to short prompts: under a dense mask sharing would cost more attention than separate rows, so the
    bounded rule keeps most samples apart; attending block by block, all samples of a prompt share it, and the
    outputs and gradients equal those of the samples packed apart."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    b = _groups([0, 1], [[0, 1, 3], [2, 0, 0]], prompt=3, resp=8)
    rows = slice(0, len(b))
    apart, bounded, blockwise = pack(b, rows), pack(b, rows, True), pack(b, rows, True, blockwise=True).trimmed()
    # each prompt (3 tokens, and 2 for group 1's, left-padded by one) once for its three samples
    assert apart.tokens - blockwise.tokens == 2 * 3 + 2 * 2 and bounded.tokens > blockwise.tokens
    blocks = blockwise.row_attention(CPU).blocks
    assert [len(blk.keys) for blk in blocks] == [1, 2, 2, 2] * 2  # per prompt: itself, then each response over it
    results = []
    for q in (apart, blockwise):
        model.zero_grad()
        out = _outputs(model, q)
        out.float().logsumexp(-1).sum().backward()
        results.append((out.detach(), {k: w.grad.clone() for k, w in model.named_parameters() if w.grad is not None}))
    (a, ga), (c, gc) = results
    assert a.shape == c.shape and (a - c).abs().max() < 2e-5
    scale = max(g.abs().max().item() for g in ga.values())
    assert max((ga[k] - gc[k]).abs().max().item() for k in ga) < 1e-5 * max(scale, 1.0)
