"""The benchmark suite end to end: `python -m benchmarks --tiny` writes every result file with sane numbers,
and `--report-only` rebuilds the .md and .png from a JSON record alone.

    .venv/bin/pytest -q tests/e2e/test_benchmarks.py      (about 2 minutes on 2 CPU cores)

Results go to a temporary directory: docs/benchmarks.md and benchmarks/results/ are left alone (the models are cached
under outputs/bench_models, the workers' logs under outputs/bench_logs, as in a real run). The demo model the
reward-model benchmark trains (outputs/demo_model, `make demo`'s) is the session's demo build when it is missing.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import common
from benchmarks.__main__ import main as suite_main
from tests.conftest import REPO, assert_ok, benchmark_launches_forked, run_cmd

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def readme_section() -> str:
    """docs/benchmarks.md's generated section (the rest of the file may be edited by anyone meanwhile)."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    return text.split("<!-- benchmarks:begin -->", 1)[1].split("<!-- benchmarks:end -->", 1)[0]


def record(results: Path, name: str) -> dict[str, Any]:
    """The one result of `name` under `results`, after checking its .md and .png are there too."""
    (path,) = results.glob(f"{name}_*_*.json")
    assert path.with_suffix(".md").stat().st_size > 0 and path.with_suffix(".png").stat().st_size > 0, path
    rec: dict[str, Any] = json.loads(path.read_text())
    assert rec["benchmark"] == name and rec["date"] in path.stem and rec["machine"]["cpu_count"] > 0
    assert rec["loadavg_1m"] >= 0
    return rec


def place_demo(demo: tuple[Path, Path]) -> None:
    """outputs/demo_model and outputs/demo_data (the trainer's defaults, which the benchmarks train on) copied from
    the session's demo build where missing: the same seeded build `make demo` writes (the benchmark's own build of
    it took 22 s of this test), moved into place whole."""
    for src, dst, done in zip(
        demo, (common.DEMO_MODEL, common.DEMO_DATA), ("demo_build.json", "val.jsonl"), strict=True
    ):
        if (dst / done).is_file():
            continue
        staging = dst.with_name(f"{dst.name}.copying")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(src, staging)
        shutil.rmtree(dst, ignore_errors=True)
        staging.rename(dst)


def test_tiny_suite_writes_every_result(
    demo: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results, readme_before = tmp_path / "results", readme_section()
    place_demo(demo)
    benchmark_launches_forked(monkeypatch)
    # sft is registered but left out: its tiny variant is three launches (ours on 1 and 2 ranks, TRL's SFTTrainer),
    # 45-70 s on 2 cores, over this test's 15 s a benchmark (`python -m benchmarks.sft --tiny`); and
    # expert_parallel: three 4-rank launches; its claims are tests/distributed/test_expert_parallel.py's
    only = "rollout,memory,sync,loading,loss_path,sequence_parallel,reward_model"
    assert suite_main(["--tiny", "--only", only, "--results", str(results)]) == 0

    rollout = record(results, "rollout")
    (run,) = rollout["runs"]
    assert len(run["rows"]) == 4  # 2 batches x 2 lengths
    for row in run["rows"]:
        for engine in ("vllm", "hf"):
            # Every sample is forced to the asked length: the counted tokens are exactly batch x length.
            assert row[f"{engine}_tokens"] == row["batch"] * row["length"], row
            assert row[f"{engine}_tokens_per_s"] > 0 and row[f"{engine}_first_token_s"] > 0
        assert row["ratio"] > 0
        # vLLM's own LLM.generate and a stream of the same requests beside the stepped driver, on the same engine.
        assert row["llm_generate_tokens_per_s"] > 0 and row["stream_tokens_per_s"] > 0
        assert row["stepped_vs_llm_generate"] > 0 and row["stream_vs_llm_generate"] > 0
    assert run["fixed_call_s"]["vllm"] > 0 and run["fixed_call_s"]["hf"] > 0

    memory = record(results, "memory")
    assert [r["ranks"] for r in memory["rows"]] == [1, 2]
    for row in memory["rows"]:
        # Each rank holds its share of parameters, gradients and AdamW state (plus the whole `step` scalars).
        assert row["params_ratio"] == pytest.approx(1 / row["ranks"])
        assert row["grads_ratio"] == pytest.approx(1 / row["ranks"])
        assert row["optimizer_ratio"] == pytest.approx(1 / row["ranks"], rel=1e-3)
        assert row["optimizer_full"] > row["params_full"] > 0

    sync = record(results, "sync")
    assert {(r["mode"], r["actor"]) for r in sync["records"]} == {("colocated", 2), ("broadcast", 1)}
    for r in sync["records"]:
        assert r["bytes"] > 0 and r["sync_s"] > 0 and r["raw_s"] > 0 and r["ratio"] > 0

    loading = record(results, "loading")
    assert {(r["format"], r["ranks"]) for r in loading["rows"]} == {("sharded", 2), ("full", 2)}
    for row in loading["rows"]:
        assert row["peak_rank"] > 0 and row["shard_rank"] * 2 == pytest.approx(row["model_bytes"], rel=0.01)

    # Both LM-head paths (benchmarks/loss_path.py's worker on 1 rank): the chunked one's slope far below.
    loss_path = record(results, "loss_path")
    before, after = (p["fit"]["slope_bytes_per_token"] for p in loss_path["paths"])
    vocab_row = loss_path["vocab_bytes_per_token"]
    assert before > 2 * vocab_row  # the full logits: several float32 vocabulary rows per token
    assert after < vocab_row and after * 4 < before  # the chunked head: below one vocabulary row per token
    for row in loss_path["rows"]:
        assert row["after_mib"] <= row["before_mib"] * 1.01

    # The same worker on sp = 1 and 2 gloo ranks: sp = 2 holds well under sp = 1's activations per rank.
    sp = record(results, "sequence_parallel")
    longest = max(r["response_len"] for r in sp["rows"])
    one, two = (next(r for r in sp["rows"] if r["sp"] == k and r["response_len"] == longest) for k in (1, 2))
    assert 0 < two["activation_bytes"] < 0.75 * one["activation_bytes"]  # measured 0.61 at 512 tokens
    assert two["ratio"] == pytest.approx(two["activation_bytes"] / one["activation_bytes"])
    # per layer 4 exchanges forward (q, k, v in, the output back) and their 4 inverses backward
    assert two["exchange_calls"] == 8 * sp["model"]["num_layers"] and one["exchange_calls"] == 0
    assert 0 < two["exchange_share"] < 1 and two["step_seconds"] > 0
    assert {f["sp"] for f in sp["fits"]} == {1, 2}

    # The real trainer with a reward model colocated on 2 ranks and on a rank of its own (3 processes).
    rm = record(results, "reward_model")
    assert [(r["placement"], r["nproc"]) for r in rm["rows"]] == [("colocated", 2), ("own_rank", 3)]
    for row in rm["rows"]:
        assert row["rm"] == "rm-demo" and row["samples_per_step"] == 16 * 8 and row["rm_params"] > 0
        assert 0 < row["rm_s"] < row["step_s"]
        assert row["rm_mean"] is not None  # reward/reward_model/mean was logged: the reward model scored
        assert row["rm_samples_per_s"] == pytest.approx(row["samples_per_step"] / row["rm_s"])
    (head,) = rm["headlines"]
    assert (
        head["step_ratio"] > 0 and rm["overlapped"] is True
    )  # the scoring on its own rank overlaps the reference forward

    latest = (results / "LATEST.md").read_text()
    assert "Rollout benchmark" in latest and "FSDP2 memory per rank" in latest and "Weight-sync" in latest
    assert "Reward-model benchmark" in latest
    assert readme_section() == readme_before  # only the repository's own results touch it


def test_report_only_rebuilds_from_json(tmp_path: Path) -> None:
    """Committed records (benchmarks/results), copied alone into a fresh directory, get their .md and .png: the
    records of the benchmarks whose workers were merged render to the committed reports byte for byte."""
    committed = REPO / "benchmarks" / "results"
    names = ("sync", "loss_path", "sequence_parallel", "agent_loop", "loading", "e2e")  # e2e: its record's 2x target
    sources = [min(committed.glob(f"{name}_amd-epyc-2c_*.json")) for name in names]
    readme_before = readme_section()
    for src in sources:
        shutil.copy(src, tmp_path / src.name)
    proc = run_cmd([sys.executable, "-m", "benchmarks", "--report-only", "--results", str(tmp_path)], timeout=120)
    assert_ok(proc)
    md = (tmp_path / sources[0].name).with_suffix(".md").read_text()
    assert md.startswith("<!-- sync: ") and "| colocated | 2 | 2 | qwen2-1m |" in md
    for src in sources:
        assert (tmp_path / src.name).with_suffix(".png").stat().st_size > 10_000
    for src in sources[1:]:
        assert (tmp_path / src.name).with_suffix(".md").read_text() == src.with_suffix(".md").read_text(), src.name
    assert "Weight-sync benchmark" in (tmp_path / "LATEST.md").read_text()
    assert readme_section() == readme_before
