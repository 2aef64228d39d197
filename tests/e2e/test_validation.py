"""Validation as verl users run it: rollout.val_kwargs (n samples, sampling) with mean@n and pass@n checked
against the logged generations by hand, trainer.log_val_generations files, and trainer.val_only scoring a
checkpoint without training (nothing of the run is changed)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import assert_ok, read_jsonl, torchrun, train_overrides

pytestmark = pytest.mark.e2e


def test_val_kwargs_generations_and_val_only(tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    val = ["rollout.val_kwargs.n=4", "rollout.val_kwargs.do_sample=true", "rollout.val_kwargs.temperature=1.0"]
    args = [*train_overrides(tiny_model, task_data, run, 2), "rollout.engine=hf", *val]
    assert_ok(torchrun(1, ["-m", "torchrl_post.train", *args, "trainer.log_val_generations=100000"]))
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if any(k.startswith("val/") for k in r)]
    assert [r["training/global_step"] for r in rows] == [0, 2]
    for row in rows:
        samples = [
            json.loads(x) for x in (run / "val_generations" / f"step_{int(row['training/global_step'])}.jsonl").open()
        ]
        n_val = len(task_data[1].read_text().splitlines())
        assert len(samples) == 4 * n_val  # every sample of the one engine: prompt-major, 4 per prompt
        by_source: dict[str, list[list[float]]] = defaultdict(list)
        for i in range(0, len(samples), 4):
            group = samples[i : i + 4]
            assert len({s["prompt"] for s in group}) == 1
            by_source[group[0]["data_source"]].append([s["score"] for s in group])
        for src, groups in by_source.items():
            mean = sum(map(sum, groups)) / (4 * len(groups))
            best = sum(map(max, groups)) / len(groups)
            assert row[f"val/test_score/{src}"] == pytest.approx(mean, abs=1e-9)
            assert row[f"val/test_score/{src}/mean@4"] == pytest.approx(mean, abs=1e-9)
            assert row[f"val/test_score/{src}/pass@4"] == pytest.approx(best, abs=1e-9)
            assert best >= mean
    # val_only: the checkpoint of step 2 is scored (greedy here); metrics and checkpoints are left as they were.
    before = (run / "metrics.jsonl").read_text()
    proc = torchrun(1, ["-m", "torchrl_post.train", *args[:-3], "trainer.val_only=true"])
    assert_ok(proc)
    assert "validation at step 2:" in proc.stdout
    only = read_jsonl(run / "val_only.jsonl")
    assert len(only) == 1 and only[0]["training/global_step"] == 2
    assert (run / "metrics.jsonl").read_text() == before
    assert not list(tmp_path.glob("run/checkpoints.*.old"))
