"""Roles on their own ranks under torchrun (gloo): the batch transfer is exact, and the broadcast weight sync
keeps the engine on the rollout ranks (one rank, or two as a tensor-parallel engine) equal to the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun
from tests.distributed.transfer_worker import GROUPS, N, sample

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("nproc", [3, 4])
def test_every_sample_arrives_once_intact_and_balanced(nproc: int, tmp_path: Path) -> None:
    assert_ok(torchrun(nproc, ["tests/distributed/transfer_worker.py", str(tmp_path)]))
    records = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(nproc)]
    seen: dict[tuple[int, int], int] = {}
    for rec in records:
        if rec["rank"] >= 2:
            assert rec["groups"] == {}, "rollout ranks receive nothing"
        for g, ids in rec["groups"].items():
            assert len(ids) == N, "a prompt's group arrives whole"
            for k, tokens in enumerate(ids):
                assert tokens == sample(int(g), k), f"group {g} sample {k} changed in transit"
                seen[(int(g), k)] = seen.get((int(g), k), 0) + 1
    assert seen == {(g, k): 1 for g in range(GROUPS) for k in range(N)}
    actor = [r for r in records if r["rank"] < 2]
    assert len(actor[0]["groups"]) == len(actor[1]["groups"]) == GROUPS // 2
    assert abs(actor[0]["tokens"] - actor[1]["tokens"]) <= actor[0]["max_group_tokens"]


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("nproc", "tp", "lora", "model"),
    [
        (3, 1, "", "tiny_model"),
        (4, 2, "", "tiny_model"),
        (3, 1, "lora", "tiny_model"),
        (3, 1, "lora-adapter", "tiny_model"),
        (3, 1, "", "tiny_tied_model"),
    ],
    ids=["3-1", "4-2", "lora-merged", "lora-adapter", "tied"],
)
def test_broadcast_sync_parity_across_ranks(
    nproc: int, tp: int, lora: str, model: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """`tied`: tied word embeddings (as SmolLM2). The embedding crosses once; the rollout rank hands it to its
    engine under both names (the plan carries the alias), or vLLM's LM head would keep the first weights."""
    out = tmp_path / "parity.json"
    args = [str(request.getfixturevalue(model)), str(tp), str(out), *([lora] if lora else [])]
    assert_ok(torchrun(nproc, ["tests/distributed/disagg_parity_worker.py", *args]))
    rec = json.loads(out.read_text())
    assert rec["buckets"] > 10, "1 KiB buckets split the model into many broadcasts"
    for r in rec["results"]:
        assert r["argmax_match"], f"update {r['update']}: engine greedy tokens differ from the trainer's argmax"
        assert r["max_logprob_diff"] < 1e-4, f"update {r['update']}: logprob diff {r['max_logprob_diff']}"
    assert rec["results"][0]["tokens"] != rec["results"][-1]["tokens"], "weights did not move"
    tied = [["lm_head.weight", "model.embed_tokens.weight"]] if model == "tiny_tied_model" else []
    assert rec["aliases"] == tied, "every rank of the sync group got the plan's aliases"


@pytest.mark.vllm
@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_vlm_broadcast_sync_parity(arch: str, tiny_vlms: dict[str, Path], tmp_path: Path) -> None:
    """A vision-language model with the engine on a rollout rank of its own: the broadcast carries the vision
    tower too, and the engine's greedy tokens and logprobs on image prompts stay the trainer's."""
    out = tmp_path / "parity.json"
    assert_ok(torchrun(3, ["tests/distributed/disagg_parity_worker.py", str(tiny_vlms[arch]), "1", str(out)]))
    rec = json.loads(out.read_text())
    for r in rec["results"]:
        assert r["argmax_match"], f"{arch} update {r['update']}: engine greedy tokens differ from the trainer's"
        assert r["max_logprob_diff"] < 1e-4, f"{arch} update {r['update']}: logprob diff {r['max_logprob_diff']}"
    assert rec["results"][0]["tokens"] != rec["results"][-1]["tokens"], "weights did not move"
