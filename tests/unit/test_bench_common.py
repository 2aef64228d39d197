"""Result naming of the benchmark suite (benchmarks/common.py) and the choice of the newest result per benchmark
(benchmarks/__main__.py), without measuring anything.

    .venv/bin/pytest -q tests/unit/test_bench_common.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.__main__ import demote, newest

EPYC = {"cpu": "AMD EPYC", "cpu_count": 2, "gpu": None}
XEON_H100 = {"cpu": "Intel(R) Xeon(R) Platinum 8480+ @ 2.0GHz", "cpu_count": 16, "gpu": "1x NVIDIA H100 80GB HBM3"}


def test_machine_tag_names_cpu_cores_and_gpu() -> None:
    assert common.machine_tag(EPYC) == "amd-epyc-2c"
    assert common.machine_tag(XEON_H100) == "intel-xeon-platinum-8480-16c-1x-nvidia-h100"
    assert common.result_stem("rollout", EPYC, "2026-11-24") == "rollout_amd-epyc-2c_2026-11-24"


def write(results: Path, name: str, machine: dict[str, Any], date: str) -> Path:
    path = results / f"{common.result_stem(name, machine, date)}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine, "date": date}))
    return path


def test_newest_prefers_this_machine_then_the_latest_date(tmp_path: Path) -> None:
    old = write(tmp_path, "memory", EPYC, "2026-11-10")
    new = write(tmp_path, "memory", EPYC, "2026-11-24")
    other = write(tmp_path, "memory", XEON_H100, "2026-12-01")  # newer, but another machine's
    write(tmp_path, "memory_extra", EPYC, "2026-12-02")  # another benchmark whose name starts the same
    assert newest(tmp_path, "memory", "amd-epyc-2c") == new
    assert newest(tmp_path, "memory", common.machine_tag(XEON_H100)) == other
    assert newest(tmp_path, "memory", "some-other-machine-4c") == other  # none of its own: the latest
    new.unlink()
    assert newest(tmp_path, "memory", "amd-epyc-2c") == old
    assert newest(tmp_path, "rollout", "amd-epyc-2c") is None


def test_demote_moves_headings_under_the_benchmark_page_title() -> None:
    assert demote("# Title\n\ntext\n## Sub") == "## Title\n\ntext\n### Sub"
    assert demote("# Title", 2) == "### Title"
