"""Expert parallelism's token dispatch (torchrl_post/workers/expert_parallel.py) on 4 gloo ranks against
transformers' Qwen3MoeExperts holding all 8 experts: outputs, the tokens' gradients and each rank's experts' weight
gradients, float32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("world", [4])  # ep = 4, two experts a rank (ep = 2 is the same code with four)
def test_all_to_all_dispatch_equals_every_expert_in_one_process(world: int, tmp_path: Path) -> None:
    out = tmp_path / "ep.json"
    assert_ok(torchrun(world, ["tests/distributed/ep_worker.py", str(out)]))
    reports = json.loads(out.read_text())
    assert len(reports) == world
    for rank in reports:
        # a whole Qwen3-MoE made expert-parallel in place (`shard_experts`): logits and every gradient
        m = rank.pop("model")
        assert m["scale"] > 1e-3 and m["logits"] < 1e-5, m
        assert m["dense"] < 1e-5 * max(1.0, m["scale"]) and m["experts"] < 1e-5 * max(1.0, m["scale"]), m
        for case, d in rank.items():
            assert d["d_scale"] > 1e-3, case  # the experts got gradient: the comparison means something
            assert d["out"] <= 1e-6 * max(1.0, d["out_scale"]), case
            for key in ("d_hidden", "d_gate_up", "d_down"):
                assert d[key] <= 1e-5 * max(1.0, d["d_scale"]), (case, key, d[key])
