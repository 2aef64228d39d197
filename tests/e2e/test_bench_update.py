"""The update benchmark end to end: `python -m benchmarks.update --tiny` runs the actor's update and the bare loop
under torchrun in every micro-batching mode and writes its JSON, Markdown and PNG.

    .venv/bin/pytest -q tests/e2e/test_bench_update.py      (about 30 s on 2 CPU cores)

Results go to a temporary directory (the tiny model is cached under outputs/bench_models, the worker's log
under outputs/bench_logs, as in a real run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import common, update
from tests.conftest import benchmark_launches_forked

pytestmark = pytest.mark.e2e


def test_tiny_update_benchmark_writes_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    benchmark_launches_forked(monkeypatch)
    common.standalone(update, ["--tiny", "--results", str(tmp_path)])
    (path,) = tmp_path.glob("update_*_*.json")
    assert path.with_suffix(".md").stat().st_size > 0 and path.with_suffix(".png").stat().st_size > 0
    rec = json.loads(path.read_text())
    assert rec["benchmark"] == "update" and rec["mode"] == "tiny"
    (run,) = rec["runs"]
    assert run["ranks"] == 1 and run["samples"] == 8
    rows = {r["mode"]: r for r in run["rows"]}
    assert list(rows) == ["fixed", "dynamic", "packed", "packed_dynamic"]
    for mode, r in rows.items():
        assert r["ours_tokens_per_s"] > 0 and r["bare_tokens_per_s"] > 0 and r["ratio"] > 0, r
        # Ours and the bare loop forward the same micro-batches: the padded modes compute the same cells.
        if not mode.startswith("packed"):
            assert r["padding_frac"] == pytest.approx(r["bare_padding_frac"]), r
            assert r["padding_frac"] > 0, r  # ragged lengths leave padding in a padded forward
        else:
            # Rows are as long as the micro-batch's longest sample: packing never pads more than padding does.
            assert r["padding_frac"] <= r["bare_padding_frac"] + 1e-9 and r["bare_packed_tokens_per_s"] > 0, r
    assert "| fixed |" in path.with_suffix(".md").read_text()
