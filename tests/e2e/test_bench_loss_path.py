"""`python -m benchmarks --tiny --only loss_path`: both LM-head paths measured under torchrun, and the chunked
one's per-token slope is far below the full-logits one's.

    .venv/bin/pytest -q tests/e2e/test_bench_loss_path.py      (about 30 s on 2 CPU cores)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_ok, run_cmd

pytestmark = pytest.mark.e2e


def test_tiny_loss_path_slopes(tmp_path: Path) -> None:
    proc = run_cmd([sys.executable, "-m", "benchmarks", "--tiny", "--only", "loss_path", "--results", str(tmp_path)])
    assert_ok(proc)
    (path,) = tmp_path.glob("loss_path_*.json")
    assert path.with_suffix(".md").stat().st_size > 0 and path.with_suffix(".png").stat().st_size > 0
    rec = json.loads(path.read_text())
    before, after = (p["fit"]["slope_bytes_per_token"] for p in rec["paths"])
    v = rec["vocab_bytes_per_token"]
    assert before > 2 * v  # the full logits: several float32 vocabulary rows per token
    assert after < v and after * 4 < before  # the chunked head: below one vocabulary row per token
    for row in rec["rows"]:
        assert row["after_mib"] <= row["before_mib"] * 1.01
