"""A weight update lands in the middle of generation (rollout/inflight.py, tests/distributed/inflight_worker.py):
the finished samples' tokens carry two policy versions, each token with the behaviour logprob of the policy that
generated it; with the context recomputed after the update exactly the new policy's, with the KV cache kept
measurably not (its earlier keys and values came from the old weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ONE_THREAD, assert_ok, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.vllm]


def test_a_weight_update_mid_generation_gives_tokens_of_two_versions(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "inflight.json"
    assert_ok(torchrun(1, ["tests/distributed/inflight_worker.py", str(tiny_model), str(out)], env=ONE_THREAD))
    report = json.loads(out.read_text())
    for mode in ("keep", "recompute"):
        samples = report[mode]["samples"]
        assert len(samples) == 4
        spanning = [s for s in samples if set(s["versions"]) == {0, 1}]
        assert spanning, f"{mode}: no sample was in flight when the update landed"
        for s in samples:
            assert s["versions"] == sorted(s["versions"]) and s["versions"][0] == 0, s["versions"]
            assert max(s["diff_old"]) < 1e-4, f"{mode}: a version-0 token's logprob is not the old policy's"
            assert s["restarts"] == (1 if mode == "recompute" and s in spanning else 0)
        # the update changed the policy, so the checks below can tell the two apart
        assert max(d for s in spanning for d in s["new_vs_old"]) > 1e-2
    recompute = [d for s in report["recompute"]["samples"] for d in s["diff_new"]]
    assert recompute and max(recompute) < 1e-4, "recomputed: a version-1 token's logprob is not the new policy's"
    # Kept KV cache: the tokens after the update attended to keys and values the old weights computed.
    keep = [d for s in report["keep"]["samples"] for d in s["diff_new"]]
    assert max(keep) > 1e-4, "the KV cache of the earlier tokens was not kept"
    # A request added after the update while others run (vLLM cannot reset its prefix cache then) shares its
    # prompt's cached blocks only with requests of its own weights: every token the new policy's.
    (late,) = report["keep"]["late"]
    assert set(late["versions"]) == {1} and max(late["diff_new"]) < 1e-4, "read a prefix the old weights computed"
