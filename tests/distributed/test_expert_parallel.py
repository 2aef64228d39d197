"""Expert parallelism (torchrl_post/workers/expert_parallel.py, workers/fsdp.py) on 2 and 4 gloo ranks, float32: the
token dispatch against transformers' Qwen3MoeExperts holding all 8 experts (outputs, the tokens' gradients, each
rank's experts' weight gradients), and the trainer's FSDP2 wrapping with the (efsdp, ep) mesh against ep = 1
(gradients, the clipped norm, the updated weights; ep = world is the layout where efsdp is one rank; HSDP on 4
ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_dispatch_equals_every_expert_in_one_process(world: int, tmp_path: Path) -> None:
    out = tmp_path / "ep.json"
    assert_ok(torchrun(world, ["tests/distributed/ep_worker.py", str(out)]))
    reports = json.loads(out.read_text())
    assert len(reports) == world
    for rank in reports:
        # the trainer's wrapping (`apply_fsdp` with the (efsdp, ep) mesh) at ep = 2 and ep = world against ep = 1:
        # every gradient gathered whole, the clipped norm, the weights after an AdamW step
        # with HSDP on 4 ranks (2 replicas of 2 shards; experts over (dp_replicate, efsdp, ep) = (2, 1, 2))
        for ep, key in [(ep, f"fsdp_ep{ep}") for ep in sorted({2, world})] + [(2, "hsdp_ep2")] * (world == 4):
            f = rank.pop(key)
            assert f["grad_scale"] > 1.0 and f["moved"] > 1e-4, f  # gradients and an update to compare
            assert f["grad"] < 1e-6 * f["grad_scale"] and f["norm"] < 1e-6 * f["norm_value"], (ep, f)
            assert f["weights"] < 1e-6, (ep, f)
            # the weight sync sends the experts as per-expert checkpoint tensors, one ep block at a time, and
            # they rebuild every parameter exactly (2 layers x 2 fused tensors x 4 experts, gate_up in 2 parts)
            assert f["sync"] == 0.0 and f["sync_pieces"] == 2 * 4 * 3 and f["sync_fused_sent"] == 0, (ep, f)
            # each layer's forward held its E / ep experts (gathered by FSDP over efsdp): ep x held / all = 1
            assert f["gathered"] == [1.0, 1.0, 2], (ep, f)
        # bfloat16 compute (float32 weights and gradients): the experts' grouped GEMM (`local_experts`) against
        # transformers' experts at ep = 1 (bfloat16 too), within a stated bfloat16 bound
        b = rank.pop("fsdp_bf16")
        assert b["grad"] < 1e-3 * b["grad_scale"] and b["norm"] < 1e-4 * b["norm_value"], b  # measured 6e-5, 6e-8
        assert b["gathered"] == [1.0, 1.0, 2], b
        # a whole Qwen3-MoE made expert-parallel in place (`shard_experts`): logits and every gradient
        m = rank.pop("model")
        assert m["scale"] > 1e-3 and m["logits"] < 1e-5, m
        assert m["dense"] < 1e-5 * max(1.0, m["scale"]) and m["experts"] < 1e-5 * max(1.0, m["scale"]), m
        for case, d in rank.items():
            assert d["d_scale"] > 1e-3, case  # the experts got gradient: the comparison means something
            assert d["out"] <= 1e-6 * max(1.0, d["out_scale"]), case
            for key in ("d_hidden", "d_gate_up", "d_down"):
                assert d[key] <= 1e-5 * max(1.0, d["d_scale"]), (case, key, d[key])
