"""Ulysses sequence parallelism end to end: the demo on 2 ranks with model.ulysses_sequence_parallel_size=2
(one sp group: each rank holds half of every row's tokens) learns as the same 2 ranks without it (FSDP, each rank
its own rows). Generation is the same in both (each rank's engine draws its own prompts), and the update is the
same to float noise, so the first steps' metrics agree closely and validation rises alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_ok, read_jsonl, torchrun

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
STEPS = 20
SAME = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "response_length/mean")


def _train(demo: tuple[Path, Path], run: Path, sp: int) -> tuple[list[dict], str]:
    model, data = demo
    proc = torchrun(
        2,
        [
            "-m", "torchrl_post.train", f"model.path={model}", f"data.train_files={data / 'train.jsonl'}",
            f"data.val_files={data / 'val.jsonl'}", f"trainer.total_training_steps={STEPS}",
            f"trainer.test_freq={STEPS}", "trainer.save_freq=-1", f"trainer.default_local_dir={run}",
            f"model.ulysses_sequence_parallel_size={sp}",
        ],
    )  # fmt: skip
    assert_ok(proc)
    return read_jsonl(run / "metrics.jsonl"), proc.stdout + proc.stderr


def test_sequence_parallel_demo_learns_like_data_parallel(demo: tuple[Path, Path], tmp_path: Path) -> None:
    sp_rows, _ = _train(demo, tmp_path / "sp2", 2)
    dp_rows, _ = _train(demo, tmp_path / "sp1", 1)
    assert "Ulysses (dp, sp) = (1, 2)" in (tmp_path / "sp2" / "plan.txt").read_text()
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
    assert len(val["sp"]) == 2 and val["sp"][1] >= val["sp"][0] + 0.1, f"validation went {val['sp']}"
    assert abs(val["sp"][1] - val["dp"][1]) <= 0.05, val
