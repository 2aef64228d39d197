"""The agent loop on the real in-process vLLM engine (one torchrun process): multi-turn trajectories keep
the engine's tokens, grow by observation deltas, and train on exactly what the engine sampled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.vllm]


def test_agent_loop_token_in_token_out(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "agent.json"
    assert_ok(torchrun(1, ["tests/distributed/agent_worker.py", str(tiny_model), str(out)]))
    r = json.loads(out.read_text())
    assert sum(r["turns"]) / len(r["turns"]) > 1.5, r["turns"]  # multi-turn
    assert r["reproducible"]
    assert r["context_grows_by_delta"] and r["rows_equal_trajectories"]
    assert r["rendered_checks"] >= 6 and r["rendered_equal"], "the token deltas differ from the chat template"
    assert r["observation_tokens"] > 0  # attended, not trained
    assert r["max_logprob_diff"] < 1e-4
    assert set(r["terms"]) <= {"env_done", "max_turns", "length", "max_prompt_length"}
