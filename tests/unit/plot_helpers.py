"""A run directory with a hand-written metrics.jsonl, shared by the plot tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _write_run(run: Path, steps: int, offset: float = 0.0, extra_line: str = "") -> Path:
    run.mkdir(parents=True)
    rows: list[dict[str, Any]] = [{"training/global_step": 0, "val/test_score/arith": 0.2 + offset}]
    for s in range(1, steps + 1):
        row: dict[str, Any] = {
            "training/global_step": s,
            "critic/score/mean": 0.1 * s + offset,
            "response_length/mean": 5.0 + s,
            "response_length/max": 9.0,
            "actor/entropy": 1.0 / s,
            "actor/ppo_kl": 0.01 * s,
            "actor/grad_norm": None if s == 2 else 1.5,  # non-finite, written as null
            "timing_s/gen": 0.3,
            "timing_s/reward": 0.05,
            "timing_s/update_actor": 0.4,
            "timing_s/sync": 0.05,
            "timing_s/gen_engine": 0.25,  # overlaps gen: not a stage
            "timing_s/step": 1.0,
        }
        if s % 3 == 0:
            row |= {"val/test_score/arith": 0.3 + offset + 0.01 * s, "timing_s/testing": 0.5}
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + extra_line)
    return run
