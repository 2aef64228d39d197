"""The LoRA sync's merge on a real PEFT model: the plain model loaded with the merged weights computes what
the adapted model computes, matches PEFT's own merge, and the adapted model is left untouched. The same for
the trainer's adapter on a Qwen3-MoE (attention and fused experts, not the router)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from torchrl_post.config.schema import ModelConfig
from torchrl_post.demo.build import build_tiny_model
from torchrl_post.sync.lora import hf_name, lora_scale, merged_weights
from torchrl_post.workers.models import load_causal_lm


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


@pytest.fixture(scope="module")
def adapted_moe(tiny_moe_model: Path) -> torch.nn.Module:
    """The tiny Qwen3-MoE with the trainer's adapter (`with_lora`, all-linear) and a random lora_B everywhere."""
    cfg = ModelConfig(path=str(tiny_moe_model), lora_rank=4, lora_alpha=8, enable_gradient_checkpointing=False)
    peft_model = load_causal_lm(cfg)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return peft_model.eval()


def test_moe_adapter_covers_attention_and_experts_not_the_router(adapted_moe: torch.nn.Module) -> None:
    trained = {n.removeprefix("base_model.model.") for n, p in adapted_moe.named_parameters() if p.requires_grad}
    layer = "model.layers.1."
    adapted = sorted({n.removeprefix(layer).split(".lora_")[0] for n in trained if n.startswith(layer)})
    assert adapted == [
        "mlp.experts",  # outer ParamWrapper: down_proj
        "mlp.experts.base_layer",  # inner ParamWrapper: gate_up_proj
        "self_attn.k_proj",
        "self_attn.o_proj",
        "self_attn.q_proj",
        "self_attn.v_proj",
    ]
    assert all(".lora_A." in n or ".lora_B." in n for n in trained)
    experts = adapted_moe.base_model.model.model.layers[1].mlp.experts
    assert [experts.parameter_name, experts.base_layer.parameter_name] == ["down_proj", "gate_up_proj"]


def test_moe_merged_weights_equal_peft_merge(tiny_moe_model: Path, adapted_moe: torch.nn.Module) -> None:
    """Every fused expert tensor gets its per-expert delta under its HF name, as PEFT's own merge_and_unload
    computes it, and the plain model loaded with the merged weights computes what the adapted model computes."""
    before = {n: p.detach().clone() for n, p in adapted_moe.named_parameters()}
    merged = dict(merged_weights(((n, p.detach()) for n, p in adapted_moe.named_parameters()), lora_scale(4, 8)))
    reference = copy.deepcopy(adapted_moe).merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=0, msg=name)
    for i in range(2):
        base = f"base_model.model.model.layers.{i}.mlp.experts.base_layer.base_layer."
        for proj in ("gate_up_proj", "down_proj"):
            delta = merged[f"model.layers.{i}.mlp.experts.{proj}"] - before[base + proj]
            assert delta.ndim == 3 and bool((delta.flatten(1).abs().amax(1) > 1e-3).all()), f"{proj}: an expert kept W"
        router = f"model.layers.{i}.mlp.gate.weight"
        assert torch.equal(merged[router], before["base_model.model." + router])
    plain = AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32).eval()
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    ids = torch.randint(4, 100, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, adapted_moe(input_ids=ids).logits, atol=1e-5, rtol=0)
    for n, p in adapted_moe.named_parameters():  # the trainer's model is untouched
        assert torch.equal(p, before[n]), n


def test_expert_names_and_a_misfit_adapter() -> None:
    base = "base_model.model.model.layers.0.mlp.experts."
    assert hf_name(base + "base_layer.base_layer.gate_up_proj") == "model.layers.0.mlp.experts.gate_up_proj"
    w = torch.zeros(4, 6, 8)  # [E, out, in]; this adapter's B has out 5
    stream = [(base + "base_layer.down_proj", w), (base + "lora_A.default.weight", torch.zeros(8, 8))]
    with pytest.raises(ValueError, match=r"does not fit \(4, 6, 8\)"):
        list(merged_weights([*stream, (base + "lora_B.default.weight", torch.zeros(5, 8))], 1.0))
