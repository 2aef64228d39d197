"""The MoE demo's sparse upcycling: identical experts behind a renormalised top-k router compute the dense MLP, so an
upcycled model without perturbation has the dense model's logits; the perturbation makes the experts differ."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from torchrl_post.demo.moe import moe_config, upcycle

SIZES = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False,
)  # fmt: skip


def _dense(arch: str) -> Any:
    """A random dense model whose attention the MoE `arch` shares: Qwen2 for Qwen2-MoE, Qwen3 for Qwen3-MoE."""
    torch.manual_seed(0)
    if arch == "qwen2_moe":
        return Qwen2ForCausalLM(Qwen2Config(**SIZES)).eval()  # type: ignore[arg-type]
    return Qwen3ForCausalLM(Qwen3Config(head_dim=32, **SIZES)).eval()  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe"])
def test_upcycled_without_noise_has_the_dense_logits(arch: str) -> None:
    dense = _dense(arch)
    with torch.no_grad():  # random MLPs and attention biases, so that a misplaced copy shows in the logits
        for p in dense.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ids = torch.randint(4, 128, (3, 17), generator=torch.Generator().manual_seed(1))
    exact = upcycle(dense, arch, noise=0.0).eval()
    perturbed = upcycle(dense, arch).eval()
    with torch.no_grad():
        want = dense(input_ids=ids).logits
        torch.testing.assert_close(exact(input_ids=ids).logits, want, atol=2e-5, rtol=0)
        assert (perturbed(input_ids=ids).logits - want).abs().max() > 1e-3, "the perturbation changed nothing"
    experts = perturbed.model.layers[0].mlp.experts  # type: ignore[union-attr]
    assert experts.gate_up_proj.shape == (4, 2 * 128, 64) and experts.down_proj.shape == (4, 64, 128)
    assert not torch.equal(experts.gate_up_proj[0], experts.gate_up_proj[1]), "the experts are identical"
    assert perturbed.model.layers[0].mlp.gate.weight.abs().sum() > 0, "the router is zero"  # type: ignore[union-attr]


def test_qwen3_moe_from_qwen2_keeps_all_but_the_attention_biases() -> None:
    """The demo's own case: a Qwen2 into a Qwen3-MoE, whose attention has no biases and adds q/k norms."""
    dense = _dense("qwen2_moe")
    moe = upcycle(dense, "qwen3_moe")
    dense_params = dict(dense.named_parameters())
    for name, p in moe.named_parameters():
        if ".mlp." not in name and not name.endswith(("q_norm.weight", "k_norm.weight")):
            assert torch.equal(p, dense_params[name]), name
    assert not any("bias" in n for n, _ in moe.named_parameters())


def test_a_width_vllm_cannot_run_is_refused() -> None:
    with pytest.raises(ValueError, match="intermediate_size=100 is not a multiple of 32"):
        moe_config(Qwen2Config(**{**SIZES, "intermediate_size": 100}), "qwen3_moe")  # type: ignore[arg-type]


def test_the_moe_config_trains_the_default_build() -> None:
    from torchrl_post.config.load import load_config
    from torchrl_post.demo.moe import ARCHS

    cfg = load_config(config_name="moe")
    assert cfg.model.path == f"outputs/moe_model_{ARCHS[0]}"  # where `python -m torchrl_post.demo.moe` writes
    assert cfg.data.train_files == "outputs/demo_data/train.jsonl"  # the dense demo's task
