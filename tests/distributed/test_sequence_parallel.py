"""Ulysses sequence parallelism in the trained roles (gloo): the actor's logprobs, entropy, policy loss,
gradient norm and updated weights, the critic's values and update, and the reference's logprobs with sp = 2
and 4 on 4 gloo ranks equal those of the same ranks without sp: padded, packed, with shared prompts, with
gradient checkpointing, with a LoRA adapter and with token-budget micro-batches, on grouped-query attention
(4 query heads over 2 key/value heads: sp = 4 repeats the key/value heads); and a mixture-of-experts model whose
actor and reference replay recorded experts (each rank's columns take their own rows of the record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = pytest.mark.distributed

CASES = ("padded", "packed", "shared", "checkpointing", "lora", "dynamic", "moe_replay")


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from torchrl_post.demo.build import build_tiny_model

    out = tmp_path_factory.mktemp("gqa_model")
    build_tiny_model(out, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96, seed=3)
    return out


@pytest.fixture(scope="module")
def gqa_moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE with 4 query heads over 2 key/value heads (2 layers, 4 experts, top-2), routers random."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from tests.conftest import _untrained

    out = tmp_path_factory.mktemp("gqa_moe_model")
    model = _untrained(
        out, Qwen3MoeConfig, Qwen3MoeForCausalLM, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
        num_experts_per_tok=2, decoder_sparse_step=1, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(5))
    model.save_pretrained(out)
    return out


def test_sequence_parallel_equals_data_parallel(gqa_model: Path, gqa_moe_model: Path, tmp_path: Path) -> None:
    world = 4  # sp = 2 (two sp groups: dp 2) and sp = 4 (one group: dp 1) against FSDP over the same 4 ranks
    out = tmp_path / "sp.json"
    args = ["tests/distributed/sp_worker.py", str(gqa_model), str(out), str(gqa_moe_model)]
    assert_ok(torchrun(world, args, timeout=900))
    reports = json.loads(out.read_text())
    layouts = [sp for sp in (2, 4) if world % sp == 0]
    for rank in reports:
        for case in CASES:
            assert rank[f"{case}_moved"] > 1e-4, case  # the update moved the weights: the comparison means something
            if case in ("padded", "shared"):  # the distillation update moved them elsewhere than the PPO one
                assert rank[f"{case}_distill_moved"] > 1e-4, case
            if case == "moe_replay":
                assert rank[f"{case}_replay_moved"] > 1e-3  # replaying the record changed the logprobs
            for sp in layouts:
                key = f"{case}_sp{sp}"
                assert rank[f"{key}_logp_diff"] < 2e-6, key
                got, base = rank[f"{key}_metrics"]
                for name, value in base.items():
                    assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-7), f"{key} {name}"
                # two Adam steps of lr 1e-3 move the weights by ~2e-3: the layouts agree to ~1e-6
                assert rank[f"{key}_weights_diff"] < 1e-5, key
                if case == "moe_replay":
                    assert rank[f"{key}_reference_diff"] < 2e-6, key
                if case in ("padded", "shared"):
                    assert rank[f"{key}_values_diff"] < 2e-6, key
                    grad_sp, grad_base = rank[f"{key}_critic_grad_norm"]
                    assert grad_sp == pytest.approx(grad_base, rel=1e-5), key
                    assert rank[f"{key}_critic_weights_diff"] < 1e-5, key
                    assert rank[f"{key}_reference_diff"] < 2e-6, key
                    # forward_kl_topk: the teacher's top-k (log p and ids) and the student's update equal sp = 1
                    assert rank[f"{key}_topk_diff"] < 2e-6, key
                    got, base = rank[f"{key}_distill_metrics"]
                    assert base["distill/loss"] > 1e-3 and 0 < base["distill/student_mass"] < 1, key
                    for name, value in base.items():
                        assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-7), f"{key} {name}"
                    assert rank[f"{key}_distill_weights_diff"] < 1e-5, key
