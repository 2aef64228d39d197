"""model.load_format=sharded: each rank reads only its rows from the safetensors files, and the actor, reference and
critic hold exactly what a full load then sharding gives (and a plain from_pretrained), buffers included; uneven
shards, a tied model whose checkpoint has no lm_head, a vision-language model whose checkpoint names transformers
renames on load, mixture-of-experts models whose checkpoints name each expert's matrices apart (Qwen3-MoE, and
Qwen2-MoE with a shared expert and an expert count the ranks do not divide) or hold the fused 3-D tensors (the
project's own HF export), on 2 ranks. Each launch loads two models (a launch costs seconds of start-up)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import _untrained, assert_ok, torchrun
from torchrl_post.workers.loading import checkpoint_files

pytestmark = pytest.mark.distributed

NPROC = 2
LAUNCHES = {
    "uneven+qwen3_moe": ("uneven_model", "tiny_moe_model"),
    "tied+fused_moe": ("tiny_tied_model", "fused_moe"),
    "vlm+qwen2_moe": ("renamed_vlm", "shared_expert_moe"),
}
"""The models each torchrun launch loads."""
EXPERTS = {"tiny_moe_model": 4, "fused_moe": 4, "shared_expert_moe": 3}
"""Experts per layer of the mixture-of-experts models (0: dense)."""
PER_EXPERT = "model.layers.0.mlp.experts.0.gate_proj.weight"
FUSED = "model.layers.0.mlp.experts.gate_up_proj"


@pytest.fixture(scope="module")
def uneven_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from torchrl_post.demo.build import build_tiny_model

    out = tmp_path_factory.mktemp("uneven_model")
    build_tiny_model(
        out, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=97, vocab_size=131
    )
    return out


@pytest.fixture(scope="module")
def renamed_vlm(tiny_vlms: dict[str, Path]) -> Path:
    """A tiny Qwen2-VL: its checkpoint names are not its parameters' (`model.layers.*`, `visual.*` load as
    `model.language_model.layers.*`, `model.visual.*`), its vision tower has rotary buffers of its own."""
    return tiny_vlms["qwen2_vl"]


@pytest.fixture(scope="module")
def fused_moe(tiny_moe_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-MoE as the project's HF export writes it (`write_hf_weights` of the model's own state dict):
    its experts under the fused names (`mlp.experts.gate_up_proj` [E, 2I, H]), not per expert."""
    from transformers import Qwen3MoeForCausalLM

    from torchrl_post.checkpoint.hf import write_hf_weights

    out = tmp_path_factory.mktemp("fused_moe")
    for f in tiny_moe_model.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    model = Qwen3MoeForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32)
    write_hf_weights(model.state_dict().items(), out, is_main=True)
    return out


@pytest.fixture(scope="module")
def shared_expert_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny Qwen2-MoE with a shared expert (and its gate) beside 3 routed experts, which 2 ranks shard
    unevenly (2 + 1); expert width 48, shared expert width 80, hidden 64, so no expert matrix is square."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    out = tmp_path_factory.mktemp("shared_expert_moe")
    _untrained(
        out, Qwen2MoeConfig, Qwen2MoeForCausalLM, hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
        shared_expert_intermediate_size=80, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        num_experts=3, num_experts_per_tok=2, decoder_sparse_step=1, tie_word_embeddings=False,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_sharded_load_equals_full_load(launch: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    models = LAUNCHES[launch]
    paths = [request.getfixturevalue(model) for model in models]
    for model, path in zip(models, paths, strict=True):  # the names each checkpoint is here to test
        if EXPERTS.get(model):
            assert (FUSED if model == "fused_moe" else PER_EXPERT) in checkpoint_files(path)
    out = tmp_path / "report.json"
    assert_ok(torchrun(NPROC, ["tests/distributed/loading_worker.py", str(out), *map(str, paths)]))
    reports = json.loads(out.read_text())
    assert len(reports) == NPROC
    for i, model in enumerate(models):
        _check(model, [ranks[i] for ranks in reports])


def _check(model: str, reports: list[dict[str, Any]]) -> None:
    for r, rank in enumerate(reports):
        assert rank["loaded_in_full"] == [], "every role must read its own rows, none fall back to a full load"
        assert rank["dtensor_sharded"] and rank["dtensor_full"]
        assert rank["actor_equals_from_pretrained"] and rank["actor_names_covered"]
        assert rank["actor_equal"] and rank["reference_equal"] and rank["critic_backbone_equal"]
        assert rank["buffers_equal"], "rotary buffers must survive the meta build"
        assert rank["logp_equal"] and rank["ref_logp_equal"]
        # The value head is new: drawn from one seed, so every rank holds the same head, with the config's std.
        vlm = model == "renamed_vlm"  # its value head has no bias (`critic.VisionValueModel`)
        assert rank["critic_head_names"] == (["score.weight"] if vlm else ["score.bias", "score.weight"])
        assert rank["critic_head"] == reports[0]["critic_head"]
        assert 0.005 < rank["critic_head_std"] < 0.05 and rank["values_finite"]
        assert rank["moved_after_update"] > 1e-3
        # FSDP2 shards a fused experts parameter along the expert dim: a rank reads its experts' tensors, no other.
        experts, per = EXPERTS.get(model, 0), -(-EXPERTS.get(model, 0) // NPROC)
        assert rank["experts_read"] == list(range(r * per, min(experts, (r + 1) * per)))
