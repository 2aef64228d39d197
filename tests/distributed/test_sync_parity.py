"""Weight sync parity: after each of several FSDP2 updates, the engine generates what the trainer would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize(
    ("engine", "lora", "model"),
    [
        pytest.param("vllm", "", "tiny_model", marks=pytest.mark.vllm),
        ("hf", "", "tiny_model"),
        pytest.param("vllm", "lora", "tiny_model", marks=pytest.mark.vllm),
        pytest.param("vllm", "lora-adapter", "tiny_model", marks=pytest.mark.vllm),
        pytest.param("vllm", "", "tiny_tied_model", marks=pytest.mark.vllm),
        ("hf", "", "tiny_tied_model"),
        pytest.param("vllm", "then-lora", "tiny_moe_model", marks=pytest.mark.vllm),
    ],
    ids=["vllm", "hf", "vllm-lora-merged", "vllm-lora-adapter", "vllm-tied", "hf-tied", "vllm-moe-then-lora"],
)
def test_engine_matches_trainer_after_updates(
    engine: str, lora: str, model: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """`tiny_tied_model` ties its LM head to the embedding (`tie_word_embeddings`, as SmolLM2): the trainer's
    parameters list it once, and vLLM's LM head, a layer of its own, stays on the first weights unless the sync
    sends it too (`lm_head.weight`): without that, the logprobs drift by 0.1-0.3 after the first update.
    `tiny_moe_model` (Qwen3-MoE, 4 experts, top-2): the FSDP2 actor shards the fused expert tensors and vLLM's CPU
    experts need their weights packed again after every reload (`repack_cpu_experts`): without it the logprobs
    are off by 0.4 after the first update, with no error. `then-lora`: the same engine (one vLLM launch) is then
    synced from a LoRA actor, whose adapter covers attention and every fused expert tensor (merged sync: W plus
    each expert's own delta under the HF expert names), with parity after each of two updates; a merged stream
    without one expert tensor must make the engine's reload name the experts layer it missed."""
    out = tmp_path / "parity.json"
    extra = [lora] if lora else []
    model_dir = request.getfixturevalue(model)
    proc = torchrun(2, ["tests/distributed/parity_worker.py", str(model_dir), engine, str(out), *extra])
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
        # The whole-batch driver over the stepped protocol gives what vLLM's LLM.generate gives, bit for bit.
        assert rank.get("driver_equals_llm_generate") is (True if engine == "vllm" else None)
        tied = model == "tiny_tied_model"
        assert rank["aliases"] == ([["lm_head.weight", "model.embed_tokens.weight"]] if tied else [])
        if lora in ("", "then-lora"):
            check_left_out_errors(engine, tied, rank["left_out"])
        if lora == "then-lora":
            check_lora_after(rank)


def check_lora_after(rank: dict) -> None:
    """The LoRA phase of `then-lora`: parity after the first sync and after each update, the policy moved, and
    the merged stream without `model.layers.1.mlp.experts.down_proj` named by the engine's accounting."""
    assert len(rank["lora_results"]) == 3
    for r in rank["lora_results"]:
        assert r["argmax_match"], f"LoRA: greedy token differs from the trainer's argmax at update {r['update']}"
        assert r["max_logprob_diff"] < 1e-4, f"LoRA: logprob off by {r['max_logprob_diff']} at update {r['update']}"
    assert rank["lora_greedy_tokens_changed"], "the LoRA updates did not change the policy: parity would be trivial"
    assert "sync missed" in rank["lora_left_out"] and "model.layers.1.mlp.experts" in rank["lora_left_out"], rank


def check_left_out_errors(engine: str, tied: bool, errors: dict[str, str]) -> None:
    """The accounting: after the parity run the worker synced twice more, leaving out `model.norm.weight`, then
    `lm_head.weight`. The engine's load_weights must raise naming what it did not get, except where nothing is
    missing (the HF engine's tied LM head is the embedding's own tensor, which arrived). vLLM's rotary caches,
    reloaded on every sync as layers of their own, stay quiet (the parity run raised nothing)."""
    assert "model.norm.weight" in errors["model.norm.weight"], errors
    assert "sync missed" in errors["model.norm.weight"], errors
    if engine == "vllm":
        assert "RMSNorm (" in errors["model.norm.weight"] and "Rotary" not in errors["model.norm.weight"], errors
        assert "ParallelLMHead (lm_head)" in errors["lm_head.weight"], errors
    elif tied:
        assert errors["lm_head.weight"] == "", errors
    else:
        assert "lm_head.weight" in errors["lm_head.weight"], errors


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


def test_a_slow_receiver_in_uneven_buckets_keeps_every_wait_within_a_bucket(tiny_model: Path, tmp_path: Path) -> None:
    """The weight broadcast to a slow receiver takes longer than the groups' timeout as a whole, yet nothing times
    out: the first actor rank waits on one bucket's broadcast at a time, and the other actor rank's next collective
    (of the actor's own group, reached while rank 0 still broadcasts: TRL #7103) waits for two buckets at most.
    The receiver gets every parameter exactly."""
    out = tmp_path / "slow_sync"
    assert_ok(torchrun(3, ["tests/distributed/slow_sync_worker.py", str(tiny_model), str(out)]))
    r0, r1, r2 = (json.loads((out / f"rank{r}.json").read_text()) for r in range(3))
    assert len(set(r0["buckets"])) > 2, f"buckets of uneven sizes: {r0['buckets']}"
    assert r2["receive_s"] > r0["timeout_s"], "the whole sync must outlast the groups' timeout"
    assert r1["next_collective_waited_s"] < r0["timeout_s"]
    assert r2["sums"] == r0["sums"] == r1["sums"]
