"""Tests of torchrl_post/workers/models.py: model.experts_implementation reaches the loaded model (pretrained and
empty), a dense model ignores it with a warning, and the expert loop and the grouped matmul give the same logits
and gradients on the tiny Qwen3-MoE (4 experts, top-2)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from torchrl_post.config.schema import ModelConfig
from torchrl_post.workers.models import empty_model, load_pretrained


@pytest.mark.parametrize("choice", ["eager", "grouped_mm", "batched_mm"])
def test_experts_implementation_reaches_the_model(tiny_moe_model: Path, choice: str) -> None:
    cfg = ModelConfig(path=str(tiny_moe_model), experts_implementation=choice)
    for model in (load_pretrained(cfg), empty_model(cfg)):
        assert model.config._experts_implementation == choice
        # each experts module reads its own config at every forward: the choice must be there too
        experts = model.model.layers[0].mlp.experts
        assert experts.config._experts_implementation == choice


def test_auto_keeps_transformers_choice(tiny_moe_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_moe_model)
    auto = load_pretrained(ModelConfig(path=str(tiny_moe_model)))
    assert auto.config._experts_implementation == plain.config._experts_implementation


def test_dense_model_ignores_the_choice(tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    """transformers refuses grouped_mm for a model without experts; here it is ignored, with one warning."""
    with caplog.at_level(logging.WARNING, logger="torchrl_post.workers.models"):
        model = load_pretrained(ModelConfig(path=str(tiny_model), experts_implementation="grouped_mm"))
    assert model.config._experts_implementation != "grouped_mm"
    assert "model.experts_implementation=grouped_mm ignored: Qwen2ForCausalLM has no experts layers" in caplog.text


def test_eager_and_grouped_mm_agree(tiny_moe_model: Path) -> None:
    ids = torch.randint(5, 60, (3, 17), generator=torch.Generator().manual_seed(0))
    results = []
    for choice in ("eager", "grouped_mm"):
        model = load_pretrained(ModelConfig(path=str(tiny_moe_model), experts_implementation=choice))
        logits = model(input_ids=ids).logits
        logits.square().mean().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (eager_logits, eager_grads), (grouped_logits, grouped_grads) = results
    torch.testing.assert_close(grouped_logits, eager_logits, rtol=0, atol=1e-5)
    assert eager_grads.keys() == grouped_grads.keys()
    assert any("experts" in n and g is not None and g.abs().sum() > 0 for n, g in eager_grads.items())
    for name, grad in eager_grads.items():
        torch.testing.assert_close(grouped_grads[name], grad, rtol=0, atol=1e-5, msg=name)
