"""Tests of torchrl_post/workers/loading.py without a process group: where each parameter of a mixture-of-experts
model is read from (`checkpoint_sources`), and the error for a checkpoint that lacks an expert's tensor. The
sharded load itself, against the full load, is tests/distributed/test_loading.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from torchrl_post.config.schema import ModelConfig
from torchrl_post.workers.loading import checkpoint_files, checkpoint_sources


def _sources(path: Path) -> dict[str, list[tuple[str, int | None, int]]]:
    sources = checkpoint_sources(ModelConfig(path=str(path)), path, checkpoint_files(path))
    return {name: sorted((p.key, p.expert, p.part) for p in pieces) for name, pieces in sources.items()}


def test_per_expert_tensors_fill_their_expert_of_the_fused_parameters(tiny_moe_model: Path) -> None:
    sources = _sources(tiny_moe_model)
    # gate_up_proj[e] = cat(gate_proj, up_proj) of expert e (transformers' qwen2_moe mapping): gate is part 0
    experts = "model.layers.1.mlp.experts"
    assert sources[f"{experts}.gate_up_proj"] == sorted(
        (f"{experts}.{e}.{proj}_proj.weight", e, part) for e in range(4) for part, proj in enumerate(("gate", "up"))
    )
    assert sources[f"{experts}.down_proj"] == [(f"{experts}.{e}.down_proj.weight", e, 0) for e in range(4)]
    # everything else is read whole under its own name; every checkpoint tensor has its place
    assert sources["model.layers.1.mlp.gate.weight"] == [("model.layers.1.mlp.gate.weight", None, 0)]
    assert sum(len(pieces) for pieces in sources.values()) == len(checkpoint_files(tiny_moe_model))


def test_a_missing_expert_tensor_is_named(tiny_moe_model: Path, tmp_path: Path) -> None:
    for f in tiny_moe_model.iterdir():
        shutil.copy2(f, tmp_path / f.name)
    tensors = load_file(tiny_moe_model / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.2.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    missing = r"model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight"
    with pytest.raises(ValueError, match=rf"experts\.gate_up_proj: the checkpoint lacks 1 .*\({missing}\)"):
        _sources(tmp_path)
