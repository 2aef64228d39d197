"""The LoRA sync's merge on a real PEFT model: the plain model loaded with the merged weights computes what
the adapted model computes, matches PEFT's own merge, and the adapted model is left untouched."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from torchrl_post.demo.build import build_tiny_model
from torchrl_post.sync.lora import hf_name, lora_scale, merged_weights


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    out = tmp_path_factory.mktemp("lora_base")
    build_tiny_model(out, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero (a no-op adapter): make it do something
                p.normal_(0, 0.05)
    return out, peft_model.eval()


def test_merged_weights_reproduce_the_adapted_model(adapted: tuple[Path, torch.nn.Module]) -> None:
    base_dir, peft_model = adapted
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    merged = dict(merged_weights(((n, p.detach()) for n, p in peft_model.named_parameters()), lora_scale(4, 8)))
    plain = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    expected = (
        set(plain.state_dict()) - {"lm_head.weight"} if plain.config.tie_word_embeddings else set(plain.state_dict())
    )
    assert set(merged) == expected
    plain.load_state_dict(merged, strict=False)
    ids = torch.randint(4, 100, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, peft_model(input_ids=ids).logits, atol=1e-5, rtol=0)
    for n, p in peft_model.named_parameters():  # the trainer's model is untouched
        assert torch.equal(p, before[n]), n
    reference = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(merged[q], reference[q], atol=1e-6, rtol=0)
    assert not torch.equal(merged[q], before["base_model.model." + q.replace(".weight", ".base_layer.weight")])


def test_names_and_errors() -> None:
    assert (
        hf_name("base_model.model.model.layers.3.mlp.up_proj.base_layer.weight") == "model.layers.3.mlp.up_proj.weight"
    )
    assert hf_name("base_model.model.lm_head.weight") == "lm_head.weight"
    w = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="without their base weight"):
        list(
            merged_weights(
                [("base_model.model.l.base_layer.weight", w), ("base_model.model.l.lora_A.default.weight", w)], 1.0
            )
        )
