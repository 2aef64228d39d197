"""Behaviour lock: the demo's first 20 steps (2 processes, default config) equal the recorded fixture.

The fixture (`golden/demo_20_steps.jsonl`, written by `python -m tests.e2e.golden.record`) holds the metrics of
the code before the step redesign; every key present in both runs, except timings and throughput, must match
to 1e-6. Floating-point results depend on the CPU, so that comparison needs the machine the fixture was
recorded on (`golden/demo_20_steps.machine.json`; elsewhere it says so and skips); on any machine, the keys no
floating-point kernel reaches (the data order, the lr schedule, the counts, the bytes synced) must equal the
fixture's and every recorded key must still be written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.golden.record import FINGERPRINT, FIXTURE, STEPS, compared_keys, machine, portable_keys, rows_by_step

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def test_demo_metrics_equal_the_recorded_run(demo_20_steps: Path) -> None:
    recorded_on = json.loads(FINGERPRINT.read_text())
    if machine() != recorded_on:
        pytest.skip(f"fixture recorded on {recorded_on}, this machine is {machine()}: float results differ by CPU")
    want = rows_by_step(FIXTURE)
    got = rows_by_step(demo_20_steps)
    assert sorted(got) == sorted(want) == list(range(STEPS + 1))
    for step in sorted(want):
        keys = compared_keys(want[step], got[step])
        assert len(keys) >= (2 if step == 0 else 20), f"step {step} shares only {keys}"
        for key in keys:
            w, g = want[step][key], got[step][key]
            assert g == pytest.approx(w, rel=1e-6, abs=1e-6), f"step {step}: {key} = {g}, recorded {w}"


def test_demo_keys_and_portable_metrics_equal_the_recorded_run_on_any_machine(demo_20_steps: Path) -> None:
    want = rows_by_step(FIXTURE)
    got = rows_by_step(demo_20_steps)
    assert sorted(got) == sorted(want) == list(range(STEPS + 1))
    for step in sorted(want):
        missing = set(compared_keys(want[step], want[step])) - set(got[step])
        assert not missing, f"step {step}: recorded keys no longer written: {sorted(missing)}"
        keys = portable_keys(want[step])
        assert len(keys) >= (1 if step == 0 else 8), f"step {step} has only {keys}"
        for key in keys:
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-9, abs=1e-9), f"step {step}: {key}"
