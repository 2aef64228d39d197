"""The GPU tier's driver (tests/gpu/driver.py, tests/gpu/conftest.py, `make gpu-check`) without a GPU: the skip
rules, the budget guard, the report's assembly, a check run in its own process (and killed at its limit), the
one line on a machine with no CUDA, and the tier's tests skipped there without starting anything.

    .venv/bin/pytest -q tests/unit/test_gpu_check.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import common
from tests.conftest import run_cmd
from tests.gpu import conftest as gpu_conftest
from tests.gpu import driver
from tests.gpu.driver import CHECKS, Check, Record, assemble, exit_code, skip_reason

BY_NAME = {c.name: c for c in CHECKS}


def test_skip_reasons_name_the_missing_package_or_the_gpus() -> None:
    have = {"vllm": False, "flash_attn": True, "trl": True, "torchrl_post.memory_plan": False}
    assert skip_reason(BY_NAME["train_vllm_colocated"], 1, have) == "vllm is not installed"
    assert skip_reason(BY_NAME["memory_plan"], 1, have) == "memory plan not available"
    assert skip_reason(BY_NAME["packed_rows_flash"], 1, have) is None
    assert skip_reason(BY_NAME["speed_vs_trl"], 1, have) is None
    have["vllm"] = True
    assert skip_reason(BY_NAME["split_placement"], 1, have) == "needs 2 GPUs, 1 visible"
    assert skip_reason(BY_NAME["split_placement"], 2, have) is None


def test_every_check_has_a_worker_function() -> None:
    from tests.gpu import checks

    assert [c.name for c in CHECKS] == list(checks.CHECKS)
    assert sum(c.timeout_s for c in CHECKS if not c.needs and c.min_gpus == 1) < driver.BUDGET_S


def test_budget_spent_fails_the_rest_and_skips_stay_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def fake_child(check: Check, device: str, limit_s: float) -> Record:
        ran.append(check.name)
        return Record(check.name, "passed", numbers={"limit": limit_s})

    monkeypatch.setattr(driver, "run_child", fake_child)
    monkeypatch.setattr(driver, "importable", lambda module: module != "vllm")
    checks = [BY_NAME["cuda_nccl"], BY_NAME["train_vllm_colocated"], BY_NAME["packed_rows_sdpa"]]
    records = driver.run_checks(checks, "cpu", budget_s=100)
    assert [r.status for r in records] == ["passed", "skipped", "passed"]
    assert records[0].numbers["limit"] == 60  # the check's own limit, below what is left of the budget
    assert records[2].numbers["limit"] <= 90
    records = driver.run_checks(checks, "cpu", budget_s=5)  # too little left to start anything
    assert [r.status for r in records] == ["failed", "skipped", "failed"]
    assert "budget" in records[0].reason and ran == ["cuda_nccl", "packed_rows_sdpa"]


def test_report_counts_statuses_and_renders(tmp_path: Path) -> None:
    speed = {
        "model": "m",
        "tokenizer": "t",
        "data": "d",
        "dtype": "bfloat16",
        "prompts": 8,
        "n": 8,
        "response_length": 128,
        "steps": 4,
        "runs": [
            {"label": "TRL", "step_s": 4.0, "steps_per_s": 0.25, "tokens_per_s": 2048.0, "vs_trl": 1.0},
            {"label": "ours (hf engine)", "step_s": 2.0, "steps_per_s": 0.5, "tokens_per_s": 4096.0, "vs_trl": 2.0},
        ],
    }
    records = [
        Record("cuda_nccl", "passed", numbers={"nccl": "2.27.3"}, seconds=2.0),
        Record("train_vllm_colocated", "skipped", "vllm is not installed"),
        Record("speed_vs_trl", "passed", numbers=speed, seconds=100.0),
    ]
    assert exit_code(records) == 0
    rec = assemble(records, "1x NVIDIA H100", 570, 102.0)
    assert rec["counts"] == {"passed": 2, "failed": 0, "skipped": 1} and rec["ok"]
    records.append(Record("packed_rows_sdpa", "failed", "packed vs padded logprobs differ by 0.5"))
    rec = assemble(records, "1x NVIDIA H100", 570, 110.0)
    assert exit_code(records) == 1 and not rec["ok"] and rec["counts"]["failed"] == 1
    h100 = {"cpu": "Intel Xeon", "cpu_count": 16, "gpu": "1x NVIDIA H100", "torch": "2.11.0", "vllm": "not installed"}
    rec |= {"machine": h100, "date": "2026-11-26"}  # common.machine() would import vLLM: seconds
    path = common.write_report(tmp_path, driver.NAME, rec, driver.markdown, driver.plot)
    assert path.name == f"gpu_check_{common.machine_tag(rec['machine'])}_2026-11-26.json"
    md = path.with_suffix(".md").read_text()
    assert "| packed_rows_sdpa | FAIL |" in md and "| train_vllm_colocated | skip |" in md and "**FAILED**" in md
    assert "| ours (hf engine) | 2.00 | 0.500 | 4096 |" in md
    assert path.with_suffix(".png").stat().st_size > 0
    assert json.loads(path.read_text())["checks"][0]["what"].startswith("torch.distributed on NCCL")


def test_a_check_runs_in_its_own_process_and_is_killed_at_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "WORK", tmp_path)
    rec = driver.run_child(BY_NAME["cuda_nccl"], "cpu", 60)  # gloo stands in for NCCL on CPU
    assert rec.status == "passed", rec.reason
    assert rec.numbers["backend"] == "gloo" and rec.seconds > 0
    rec = driver.run_child(BY_NAME["cuda_nccl"], "cpu", 0.3)  # python alone takes longer to start
    assert rec.status == "failed" and rec.reason.startswith("timed out after 0 s")


def test_no_cuda_is_one_line_and_no_report(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(common, "write_report", lambda *a: pytest.fail("no report without a GPU"))
    options = {"gpu_check": True, "gpu_device": "cuda"}
    config = SimpleNamespace(getoption=options.__getitem__)
    assert gpu_conftest.pytest_cmdline_main(config) == 0  # type: ignore[arg-type]  # the command ends here
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("gpu-check: no CUDA device visible (torch ")
    assert out[0].endswith("; nothing to check")
    options["gpu_device"] = "cpu"  # the plumbing runs without a GPU
    assert gpu_conftest.pytest_cmdline_main(config) is None  # type: ignore[arg-type]
    options |= {"gpu_check": False, "gpu_device": "cuda"}  # plain pytest: the tests skip one by one instead
    assert gpu_conftest.pytest_cmdline_main(config) is None  # type: ignore[arg-type]
    assert capsys.readouterr().out == ""
    assert driver.no_gpu_reason() == f"no CUDA device visible (torch {torch.__version__}, cuda unavailable)"


def make_gpu_check() -> list[str]:
    """The command `make gpu-check` runs (its recipe, as make prints it without running it), on this python."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # not a sub-make
    cmd = ["make", "-n", "--no-print-directory", "gpu-check", f"PY_GPU={sys.executable}"]
    proc = subprocess.run(cmd, cwd=common.ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    return line.split()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_command_on_this_machine_prints_one_line() -> None:
    cmd = make_gpu_check()
    assert cmd[:4] == [sys.executable, "-m", "pytest", "tests/gpu"] and "--gpu-check" in cmd
    proc = run_cmd(cmd, timeout=60)  # forked from the suite's launcher, after torch's import
    assert proc.returncode == 0 and proc.stderr == ""
    assert (
        proc.stdout
        == f"gpu-check: no CUDA device visible (torch {torch.__version__}, cuda unavailable); nothing to check\n"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_the_tier_skips_in_the_normal_suite(tmp_path: Path) -> None:
    """`pytest tests/gpu` without a CUDA device (as `pytest tests` collects it): every check skipped with the
    no-CUDA reason (in the session fixture, before the runner exists: nothing started), and no report."""
    proc = run_cmd(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/gpu",
         "--gpu-results", str(tmp_path / "results")],
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(CHECKS)} skipped" in proc.stdout
    assert "no CUDA device visible (torch " in proc.stdout
    assert not (tmp_path / "results").exists()
