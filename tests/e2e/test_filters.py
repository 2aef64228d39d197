"""Filters through the real entrypoint: rejection sampling (admission: uniform groups dropped as they complete and
replaced, within a budget) and compact filtering, colocated (through a resume, which must carry the groups left
over exactly) and on a rollout rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_ok, read_jsonl, resumed_from, torchrun, train_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
FILTERS = [
    "algorithm.rejection_sample.enable=true",
    "algorithm.rejection_sample.max_extra_rounds=1",
    "algorithm.compact_filtering.enable=true",
    "trainer.test_freq=0",
]
KEYS = [
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "filter/length",
    "filter/rejection/dropped_groups",
    "filter/rejection/extra_rounds",
    "filter/rejection/short_groups",
]


def _train(nproc: int, model: Path, data: tuple[Path, Path], run: Path, steps: int, *extra: str) -> dict[int, dict]:
    args = [a for a in train_overrides(model, data, run, steps) if not a.startswith(("reward.function=", "rollout.n="))]
    # A binary reward and pairs of samples: about half the groups of the random model are uniform.
    args += ["reward.function=tests.e2e.rewards:has_digit", "rollout.n=2"]
    assert_ok(torchrun(nproc, ["-m", "torchrl_post.train", *args, *FILTERS, *extra]))
    return {int(r["training/global_step"]): r for r in read_jsonl(run / "metrics.jsonl")}


def test_filters_count_and_resume_exactly(tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path) -> None:
    straight = _train(2, tiny_model, task_data, tmp_path / "straight", 4)
    split = _train(2, tiny_model, task_data, tmp_path / "split", 4, *resumed_from(tmp_path / "straight", 2))
    assert sorted(split) == [3, 4]
    for step in (1, 2, 3, 4):
        row = straight[step]
        # Compact filtering masks exactly the truncated samples.
        assert row["filter/length"] == pytest.approx(row["response_length/clip_ratio"])
        assert row["filter/rejection/extra_rounds"] <= 2  # at most one share of replacements on each of 2 engines
        for key in KEYS if step in split else ():
            assert split[step][key] == pytest.approx(row[key], rel=1e-6, abs=1e-7), f"{key} differs at step {step}"
    assert sum(straight[s]["filter/rejection/dropped_groups"] for s in (1, 2, 3, 4)) > 0
    assert sum(straight[s]["filter/rejection/extra_rounds"] for s in (1, 2, 3, 4)) > 0


def test_filters_on_a_rollout_rank(tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path) -> None:
    rows = _train(3, tiny_model, task_data, tmp_path, 2, "placement.actor=[0,1]", "placement.rollout=[2]")
    for step in (1, 2):
        assert rows[step]["filter/rejection/extra_rounds"] <= 1  # one engine, one share of replacements at most
        assert rows[step]["filter/length"] == pytest.approx(rows[step]["response_length/clip_ratio"])
        assert rows[step]["filter/rejection/short_groups"] <= 4  # the batch stays full: 4 groups, some at weight 0
