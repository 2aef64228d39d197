"""The end-to-end benchmark (benchmarks/e2e.py) in its tiny mode writes a record, a table and a plot with real
step times: the real entrypoint on a tiny Qwen2 over real GSM8K prompts, 2 steps; TRL's side only when its
environment (outputs/bench_venvs/trl) already exists, never installed here.

    .venv/bin/pytest -q tests/e2e/test_bench_e2e.py      (about a minute on 2 CPU cores; more with TRL's side)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import common, e2e
from tests.conftest import benchmark_launches_forked

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def test_tiny_e2e_benchmark_writes_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    benchmark_launches_forked(monkeypatch)
    common.standalone(e2e, ["--tiny", "--results", str(results)])

    (path,) = results.glob("e2e_*_*.json")
    assert path.with_suffix(".md").stat().st_size > 0 and path.with_suffix(".png").stat().st_size > 0
    rec = json.loads(path.read_text())
    assert rec["benchmark"] == "e2e" and rec["mode"] == "tiny" and rec["loadavg_1m"] >= 0
    (model,) = rec["models"]
    ours = model["ours"]
    assert len(ours["steps_s"]) == 2 and all(s > 0 for s in ours["steps_s"])
    assert ours["step_s"] > 0 and ours["stages"]["gen"] > 0 and ours["stages"]["update_actor"] > 0
    # The stages partition the step: what no stage timed is small next to it.
    assert sum(v for k, v in ours["stages"].items() if k != "gen_engine") <= ours["step_s"] * 1.01
    assert ours["response_length_mean"] > 0
    if model["trl"] is not None:  # TRL's environment was there: its side ran on the same batch
        assert model["trl"]["step_s"] > 0 and model["ratio"] == pytest.approx(model["trl"]["step_s"] / ours["step_s"])
    md = path.with_suffix(".md").read_text()
    assert "| tiny |" in md and f"{ours['step_s']:.2f}" in md
