"""Weight sync parity: after each of several FSDP2 updates, the engine generates what the trainer would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize(
    ("engine", "lora"),
    [
        pytest.param("vllm", "", marks=pytest.mark.vllm),
        ("hf", ""),
        pytest.param("vllm", "lora", marks=pytest.mark.vllm),
        pytest.param("vllm", "lora-adapter", marks=pytest.mark.vllm),
    ],
    ids=["vllm", "hf", "vllm-lora-merged", "vllm-lora-adapter"],
)
def test_engine_matches_trainer_after_updates(engine: str, lora: str, tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "parity.json"
    extra = [lora] if lora else []
    proc = torchrun(2, ["tests/distributed/parity_worker.py", str(tiny_model), engine, str(out), *extra])
    assert_ok(proc)
    ranks = json.loads(out.read_text())
    assert len(ranks) == 2
    for rank in ranks:
        assert len(rank["results"]) == 4
        for r in rank["results"]:
            assert r["argmax_match"], f"{engine} greedy token differs from the trainer's argmax at update {r['update']}"
            assert r["max_logprob_diff"] < 1e-4, (
                f"{engine} logprob off by {r['max_logprob_diff']} at update {r['update']}"
            )
        assert rank["greedy_tokens_changed"], "the updates did not change the policy: parity would be trivial"


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("arch", "lora"),
    [("qwen2_vl", ""), ("qwen2_5_vl", ""), ("qwen3_vl", ""), ("qwen2_vl", "lora-adapter")],
    ids=["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_vl-lora-adapter"],
)
def test_vlm_engine_matches_trainer_after_updates(
    arch: str, lora: str, tiny_vlms: dict[str, Path], tmp_path: Path
) -> None:
    """A vision-language model, colocated: prompts carry images, the FSDP2 actor (vision tower included) trains,
    and after every sync (which resets vLLM's encoder cache) vLLM's greedy tokens and logprobs are the trainer's,
    whose forward gets the pixel values, grids and M-RoPE positions. With a LoRA adapter loaded as vLLM's own
    (the adapter covers the language model: vLLM's LoRA does not reach the vision tower)."""
    out = tmp_path / "parity.json"
    args = [str(tiny_vlms[arch]), "vllm", str(out), *([lora] if lora else [])]
    assert_ok(torchrun(2, ["tests/distributed/parity_worker.py", *args]))
    for rank in json.loads(out.read_text()):
        assert len(rank["results"]) == 4
        for r in rank["results"]:
            assert r["argmax_match"], f"{arch}: greedy token differs from the trainer's argmax at update {r['update']}"
            assert r["max_logprob_diff"] < 1e-4, f"{arch}: logprob off by {r['max_logprob_diff']} at {r['update']}"
        assert rank["greedy_tokens_changed"], "the updates did not change the policy: parity would be trivial"
