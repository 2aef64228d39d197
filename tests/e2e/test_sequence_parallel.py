"""Ulysses sequence parallelism end to end: the demo on 2 ranks with model.ulysses_sequence_parallel_size=2
(one sp group: each rank holds half of every row's tokens) learns as the same 2 ranks without it (FSDP, each rank
its own rows: the default demo run, `demo_20_steps`). Generation is the same in both (each rank's engine draws its
own prompts), and the update is the same to float noise, so the first steps' metrics agree closely and validation
rises alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import read_jsonl
from tests.e2e.golden.record import STEPS, run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
SAME = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "response_length/mean")


def test_sequence_parallel_demo_learns_like_data_parallel(
    demo: tuple[Path, Path], demo_20_steps: Path, tmp_path: Path
) -> None:
    sp_rows = read_jsonl(
        run_demo(tmp_path, demo, "model.ulysses_sequence_parallel_size=2", f"trainer.test_freq={STEPS}")
    )
    dp_rows = read_jsonl(demo_20_steps)
    assert "Ulysses (dp, sp) = (1, 2)" in (tmp_path / "run" / "plan.txt").read_text()
    by_step = {r["training/global_step"]: r for r in dp_rows}
    first = [r for r in sp_rows if r["training/global_step"] in (1, 2)]
    assert len(first) == 2
    for row in first:  # the same samples, the same update up to float noise
        for key in SAME:
            want = by_step[row["training/global_step"]][key]
            assert row[key] == pytest.approx(want, rel=1e-4, abs=1e-6), f"step {row['training/global_step']}: {key}"
    val = {
        name: [r["val/test_score/arithmetic"] for r in rows if "val/test_score/arithmetic" in r]
        for name, rows in (("sp", sp_rows), ("dp", dp_rows))
    }
    assert val["sp"][0] == val["dp"][0] and val["sp"][-1] >= val["sp"][0] + 0.1, val
    assert abs(val["sp"][-1] - val["dp"][-1]) <= 0.05, val
