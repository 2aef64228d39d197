"""model.load_format=sharded: each rank reads only its rows from the safetensors files, and the actor, reference and
critic hold exactly what a full load then sharding gives (and a plain from_pretrained), buffers included; uneven
shards, a tied model whose checkpoint has no lm_head, a vision-language model whose checkpoint names transformers
renames on load, 1 and 2 ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = pytest.mark.distributed


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


@pytest.mark.parametrize(("nproc", "model"), [(2, "uneven_model"), (2, "tiny_tied_model"), (2, "renamed_vlm")])
def test_sharded_load_equals_full_load(nproc: int, model: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    path = request.getfixturevalue(model)
    out = tmp_path / "report.json"
    assert_ok(torchrun(nproc, ["tests/distributed/loading_worker.py", str(path), str(out)]))
    reports = json.loads(out.read_text())
    assert len(reports) == nproc
    for rank in reports:
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
