"""The async-rollout benchmark's pure parts: the long-tailed task's lengths and reward
(benchmarks/longtail_task.py), and the summaries and report (benchmarks/async_rollout.py) on hand-made rows."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from benchmarks import async_rollout, longtail_task


def test_asked_lengths_are_long_tailed() -> None:
    rows = longtail_task.make_rows(2000, seed=0)
    lengths = [r["length"] for r in rows]
    assert all(len(r["answer"]) == r["length"] for r in rows)
    assert statistics.median(lengths) <= 4  # most short
    assert 0.07 < sum(n >= 90 for n in lengths) / len(lengths) < 0.13  # one in ten long
    assert min(lengths) == 1 and max(lengths) == longtail_task.MAX_TARGET
    assert statistics.mean(lengths) > 4 * statistics.median(lengths)  # the tail carries the mean
    assert longtail_task.make_rows(50, seed=3) == longtail_task.make_rows(50, seed=3)


def test_target_length_and_answer() -> None:
    assert [longtail_task.target_length(u) for u in (0.0, 0.5, 0.9, 0.99)] == [1, 4, 89, 200]
    assert longtail_task.answer(12, 7) == "789012345678"
    for r in longtail_task.make_rows(20, seed=0):  # the prompt names the length and the first digit
        assert f"{r['length']} " in r["prompt"] and r["prompt"].endswith(f"from {r['answer'][0]}.")


def test_score_peaks_at_the_asked_length() -> None:
    truth = "7890"
    assert longtail_task.score("longtail", "7890", truth) == 1.0
    assert longtail_task.score("longtail", " 7890\n", truth) == 1.0
    assert longtail_task.score("longtail", "78", truth) == 0.5
    assert longtail_task.score("longtail", "789012", truth) == 0.5
    assert longtail_task.score("longtail", "", truth) == 0.0
    assert longtail_task.score("longtail", "7" * 20, truth) == 0.0


def step(i: int, resp: float, step_s: float, wait: float, gen: float, **extra: float) -> dict[str, Any]:
    return {
        "training/global_step": i, "timing_s/step": step_s, "timing_s/rollout_wait": wait, "timing_s/gen": gen,
        "prompt_length/mean": 30.0, "response_length/mean": resp, "critic/score/mean": 0.5, **extra,
    }  # fmt: skip


def test_summarize_hand_computed() -> None:
    rows = [
        {"training/global_step": 0, "val/test_score/longtail": 0.4},  # validation before training
        step(1, 10.0, 9.0, 8.0, 7.0, **{"rollout/staleness_groups/0": 4.0}),  # warm-up, left out of rates
        step(2, 20.0, 2.0, 0.5, 1.0, **{"rollout/staleness_groups/0": 3.0, "rollout/staleness_groups/1": 1.0}),
        step(3, 30.0, 3.0, 0.1, 0.5, **{"rollout/staleness_groups/2": 4.0, "rollout/stale_dropped_groups": 2.0}),
        {"training/global_step": 3, "val/test_score/longtail": 0.6, "val/test_score/longtail/pass@4": 0.9},
    ]
    s = async_rollout.summarize(rows, samples=8, warmup=1)
    assert s["measured_steps"] == 2 and s["step_s"] == pytest.approx(2.5)
    # tokens: 8 x (30 + 20) + 8 x (30 + 30) = 880 over 5 s
    assert s["tokens_per_s"] == pytest.approx(176.0)
    assert s["samples_per_s"] == pytest.approx(16 / 5)
    # step 2's rollout wait is reported with step 3 (0.1 s); step 3's would come with step 4
    assert s["rollout_idle"] == pytest.approx(0.1 / 2) and s["actor_idle"] == pytest.approx(1.5 / 5)
    assert s["response_length"] == pytest.approx(20.0)  # every step's
    assert s["staleness_hist"] == {"0": 7.0, "1": 1.0, "2": 4.0, "3": 0.0, "4+": 0.0}
    assert s["stale_dropped"] == 2.0 and s["val"] == {0: 0.4, 3: 0.6}


def run_summary(tok: float, samples: float, val: dict[int, float], idle: float = 0.5) -> dict[str, Any]:
    return {
        "step_s": 1.0, "tokens_per_s": tok, "samples_per_s": samples, "rollout_idle": idle, "actor_idle": 0.1,
        "response_length": 20.0, "score": 0.5, "stale_dropped": 0.0, "val": val,
        "staleness_hist": {b: 1.0 for b in async_rollout.STALENESS_BINS},
    }  # fmt: skip


def test_combine_goal_and_noise() -> None:
    ref_runs = [run_summary(100.0, 4.0, {0: 0.4, 10: 0.60}), run_summary(120.0, 6.0, {0: 0.4, 10: 0.64})]
    fast_runs = [run_summary(200.0, 6.0, {0: 0.4, 10: 0.58}, 0.05), run_summary(160.0, 9.0, {0: 0.4, 10: 0.60}, 0.07)]
    ref = async_rollout.combine(ref_runs, None)
    assert ref["tokens_per_s"] == 110.0 and ref["speedup_tokens"] == 1.0 and ref["val_last"] == pytest.approx(0.62)
    fast = async_rollout.combine(fast_runs, ref)
    assert fast["speedup_tokens"] == pytest.approx(180 / 110) and fast["speedup_samples"] == pytest.approx(7.5 / 5)
    assert fast["staleness_hist"]["4+"] == 2.0 and fast["val"] == {0: 0.4, 10: pytest.approx(0.59)}
    noise = async_rollout.val_noise({"a": ref_runs, "b": fast_runs})
    assert noise == pytest.approx(0.04)
    assert async_rollout.goal_met(fast, ref, noise) == {"speedup": True, "rollout_idle": True, "validation": True}
    assert async_rollout.goal_met(fast, ref, 0.0)["validation"] is False
    slow = async_rollout.combine([run_summary(120.0, 5.0, {10: 0.7}, 0.2)], ref)
    assert async_rollout.goal_met(slow, ref, noise) == {"speedup": False, "rollout_idle": False, "validation": True}


def test_report_from_a_json_record(tmp_path: Path) -> None:
    ref = async_rollout.combine([run_summary(100.0, 4.0, {0: 0.4, 10: 0.6})], None)
    fast = async_rollout.combine([run_summary(180.0, 5.0, {0: 0.4, 10: 0.6}, 0.05)], ref)
    rows = [{"config": "on_policy", "label": "on-policy", **ref}, {"config": "partial", "label": "partial", **fast}]
    for r in rows:
        r["goal"] = async_rollout.goal_met(r, ref, 0.0)
    settings = {"steps": 10, "repeats": 1, "prompts": 16, "n": 8, "warmup_steps": 2, "max_response_length": 256}
    rec = {
        "machine": {"cpu_count": 2}, "settings": settings, "rows": rows, "val_noise": 0.0,
        "runs": [
            {"config": "on_policy", "tokens_per_s": 100.0, "loadavg_1m": 3.0},
            {"config": "partial", "tokens_per_s": 180.0, "loadavg_1m": 4.0},
        ],
    }  # fmt: skip
    rec = json.loads(json.dumps(rec))  # as --report-only reads it: the validation steps become strings
    md = async_rollout.markdown(rec)
    assert (
        "| partial | 180 | 1.80x | 5.0 | 1.25x | 20.0 | 5% | 10% | 1 / 1 / 1 / 1 / 1 | 0 | 0.500 | 0.400, 0.600 |" in md
    )
    assert "- partial: 1.80x on-policy's tokens/s" in md and "meets the goal." in md
    assert "- on-policy: 100 (load 3.0)" in md and "- partial: 180 (load 4.0)" in md
    async_rollout.plot(tmp_path / "p.png", rec)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
