"""The agent loop on the real in-process vLLM engine (one torchrun process): multi-turn trajectories keep
the engine's tokens, grow by observation deltas, and train on exactly what the engine sampled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ONE_THREAD, assert_ok, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.vllm]


@pytest.fixture(scope="module")
def tp1_report(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("agent_tp1") / "agent.json"
    assert_ok(torchrun(1, ["tests/distributed/agent_worker.py", str(tiny_model), str(out)], env=ONE_THREAD))
    return json.loads(out.read_text())


def test_agent_loop_token_in_token_out(tp1_report: dict) -> None:
    r = tp1_report
    assert sum(r["turns"]) / len(r["turns"]) > 1.5, r["turns"]  # multi-turn
    assert r["reproducible"]
    assert r["context_grows_by_delta"] and r["rows_equal_trajectories"]
    assert r["rendered_checks"] >= 6 and r["rendered_equal"], "the token deltas differ from the chat template"
    assert r["observation_tokens"] > 0  # attended, not trained
    assert r["max_logprob_diff"] < 1e-4
    assert set(r["terms"]) <= {"env_done", "max_turns", "length", "max_prompt_length"}


def test_hf_engine_runs_the_same_loop(tp1_report: dict) -> None:
    r = tp1_report
    assert sum(r["hf_turns"]) / len(r["hf_turns"]) > 1.5 and r["hf_context_grows_by_delta"]
    assert r["hf_engine_steps"] == max(r["hf_turns"])  # one batch per turn
    assert r["hf_max_logprob_diff"] < 1e-4


def test_tensor_parallel_engine_in_lockstep_gives_the_same_trajectories(
    tiny_model: Path, tp1_report: dict, tmp_path: Path
) -> None:
    """TP=2 (the first rank decides adds and aborts and broadcasts them) samples what TP=1 samples."""
    two = tmp_path / "tp2.json"
    assert_ok(torchrun(2, ["tests/distributed/agent_worker.py", str(tiny_model), str(two), "2"]))
    r1, r2 = tp1_report, json.loads(two.read_text())
    assert r2["ranks_agree"] and r2["reproducible"]
    assert sum(r1["turns"]) > len(r1["turns"])  # multi-turn, so later turns were added mid-flight
    assert r2["responses"] == r1["responses"]
    assert r2["terms"] == r1["terms"]


def test_tool_call_on_the_real_qwen_tokenizer(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """A hermes `<tool_call>` in Qwen2.5's real vocabulary: parsed by vLLM's parser, the calculator runs, its
    result comes back as Qwen's tool turn (with the newline after `<|im_end|>` the model never emits, loss
    mask 0), and every token the trainer sees is the engine's."""
    from torchrl_post.demo.qwen import build_tiny_qwen_model

    model = build_tiny_qwen_model(tmp_path_factory.mktemp("tiny_qwen") / "model")
    out = tmp_path / "tool.json"
    # One thread (the background builds take a core: two threads took this test from 41 s to 240 s)
    assert_ok(torchrun(1, ["tests/distributed/tool_worker.py", str(model), str(tmp_path), str(out)], env=ONE_THREAD))
    r = json.loads(out.read_text())
    assert r["first_response"].startswith("<tool_call>") and r["first_response"].endswith("<|im_end|>")
    assert r["tool_calls"] == 1 and r["tool_errors"] == 0
    assert (
        r["observation"]
        == "\n<|im_start|>user\n<tool_response>\n80235\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert r["turns"] == 2 and r["termination"] == "env_done" and r["reward"] == 1.0
    assert r["tokens_equal_taught"] and r["context_equals_template"] and r["observation_masked"]
    assert r["max_logprob_diff"] < 1e-3
