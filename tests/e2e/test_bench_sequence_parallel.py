"""`python -m benchmarks --tiny --only sequence_parallel`: one actor update per length on sp = 1 and 2 gloo ranks;
the files load, and sp = 2 holds well under sp = 1's activations per rank at the longest length.

    .venv/bin/pytest -q tests/e2e/test_bench_sequence_parallel.py      (about 20 s on 2 CPU cores)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_ok, run_cmd

pytestmark = pytest.mark.e2e


def test_tiny_sequence_parallel_divides_activations(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks", "--tiny", "--only", "sequence_parallel", "--results", str(tmp_path)]
    proc = run_cmd(cmd)
    assert_ok(proc)
    (path,) = tmp_path.glob("sequence_parallel_*.json")
    assert path.with_suffix(".md").stat().st_size > 0 and path.with_suffix(".png").stat().st_size > 0
    rec = json.loads(path.read_text())
    longest = max(r["response_len"] for r in rec["rows"])
    one, two = (next(r for r in rec["rows"] if r["sp"] == sp and r["response_len"] == longest) for sp in (1, 2))
    assert 0 < two["activation_bytes"] < 0.75 * one["activation_bytes"]  # measured 0.61 at 512 tokens
    assert two["ratio"] == pytest.approx(two["activation_bytes"] / one["activation_bytes"])
    # per layer 4 exchanges forward (q, k, v in, the output back) and their 4 inverses backward
    assert two["exchange_calls"] == 8 * rec["model"]["num_layers"] and one["exchange_calls"] == 0
    assert 0 < two["exchange_share"] < 1 and two["step_seconds"] > 0
    assert {f["sp"] for f in rec["fits"]} == {1, 2}
