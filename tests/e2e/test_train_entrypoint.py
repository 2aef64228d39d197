"""The real entrypoint under torchrun on a tiny model: it trains, writes its run, and a second launch resumes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.conftest import assert_ok, read_jsonl, run_cmd, torchrun, train_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REQUIRED = [
    "training/global_step",
    "actor/loss",
    "actor/entropy",
    "actor/ppo_ratio_mean",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "critic/score/mean",
    "response_length/mean",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_s/sync",
    "timing_s/step",
    "perf/throughput",
    "rollout/logprob_diff",
    "reward/errors",
]


def test_train_then_resume(tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [*train_overrides(tiny_model, task_data, run, 4), "trainer.plots=true"]
    assert_ok(torchrun(2, ["-m", "torchrl_post.train", *args], real=True))  # the torchrun command itself

    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["training/global_step"] for r in rows] == [0, 1, 2, 3, 4]
    assert "val/test_score/arithmetic" in rows[0] and "val/test_score/arithmetic" in rows[2]
    for row in rows[1:]:
        for key in REQUIRED:
            assert key in row and math.isfinite(row[key]), (
                f"{key} missing or not finite at step {row['training/global_step']}"
            )
        assert row["actor/ppo_ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy single pass
        assert "timing_s/old_log_prob" not in row  # ... which needs no extra forward for old logprobs
        assert row["rollout/logprob_diff"] < 1e-3  # engine and trainer agree on the behaviour policy
    ckpts = run / "checkpoints"
    assert (ckpts / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert (ckpts / "global_step_2" / "trainer_state.json").exists()
    assert (run / "config.yaml").read_text().count("default_local_dir") == 1
    assert (run / "plots" / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The saved weights differ from the initial ones: training really changed the parameters.
    dcp_to_torch_save(str(ckpts / "global_step_4" / "actor"), str(tmp_path / "actor.pt"))
    trained = torch.load(tmp_path / "actor.pt", weights_only=True)["model"]
    initial = load_file(str(tiny_model / "model.safetensors"))
    assert set(trained) == set(initial)
    changed = [k for k in initial if not torch.equal(trained[k], initial[k])]
    assert len(changed) > len(initial) // 2, f"only {changed} changed"

    # A second launch with a larger budget resumes from step 4 and continues the same history.
    proc = torchrun(2, ["-m", "torchrl_post.train", *train_overrides(tiny_model, task_data, run, 6)])
    assert_ok(proc)
    assert "resumed from" in proc.stdout + proc.stderr
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["training/global_step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    assert (ckpts / "latest_checkpointed_iteration.txt").read_text().strip() == "6"


def _one_line_error(proc, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr[-3000:]


def test_bad_inputs_fail_with_one_line(tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path) -> None:
    base = ["-m", "torchrl_post.train", f"trainer.default_local_dir={tmp_path / 'run'}"]
    py = [str(Path(__import__("sys").executable))]
    data = [f"data.train_files={task_data[0]}", f"data.val_files={task_data[1]}"]
    _one_line_error(run_cmd(py + base + data + [f"model.path={tmp_path}"]), "model.path")
    _one_line_error(
        run_cmd(py + base + [f"model.path={tiny_model}", f"data.train_files={tmp_path}/nope.jsonl"]), "nope.jsonl"
    )
    _one_line_error(run_cmd(py + base + ["actor.lrr=1"]), "actor.lrr")
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tiny_model / "config.json").read_text())
    _one_line_error(run_cmd(py + base + data + [f"model.path={no_weights}"]), "no *.safetensors")
    _one_line_error(run_cmd(py + base + ["data.train_batch_size=lots"]), "data.train_batch_size")
    # Impossible batch arithmetic across 2 ranks fails before any model loads.
    _one_line_error(torchrun(2, base + ["data.train_batch_size=3"]), "data.train_batch_size=3")
    # Nothing was written by the failed runs.
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_dry_run_prints_plan_without_loading(tmp_path: Path) -> None:
    proc = run_cmd(
        [
            __import__("sys").executable,
            "-m",
            "torchrl_post.train",
            "trainer.dry_run=true",
            f"model.path={tmp_path / 'no_model'}",
        ]
    )
    assert_ok(proc)
    assert "actor     ranks [0]" in proc.stdout and "samples_per_actor_rank: 128" in proc.stdout


def test_hf_engine_without_validation_or_saving(tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path) -> None:
    """rollout.engine=hf; test_freq/save_freq <= 0 turn validation and saving off; val_files=null is no val set."""
    run = tmp_path / "run"
    overrides = train_overrides(tiny_model, task_data, run, 2)
    overrides = [o for o in overrides if not o.startswith(("trainer.test_freq", "trainer.save_freq", "data.val_files"))]
    overrides += ["rollout.engine=hf", "trainer.test_freq=0", "trainer.save_freq=-1", "data.val_files=null"]
    # Off-policy update: 2 epochs x 4 mini-batches of one prompt (4 samples: 2 per rank, as verl splits a mini-batch's
    # samples, not its prompts, over the ranks), so old logprobs come from their own forward pass.
    overrides += ["actor.ppo_epochs=2", "actor.ppo_mini_batch_size=1", "actor.loss_agg_mode=seq-mean-token-mean"]
    assert_ok(torchrun(2, ["-m", "torchrl_post.train", *overrides]))
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["training/global_step"] for r in rows] == [1, 2]
    assert not any(k.startswith("val/") for r in rows for k in r)
    assert not (run / "checkpoints").exists()
    assert rows[-1]["rollout/logprob_diff"] < 1e-3
    assert all(r["actor/optimizer_steps"] == 8 and "timing_s/old_log_prob" in r for r in rows)
    assert rows[-1]["actor/ppo_ratio_mean"] != 1.0  # later mini-batches see an updated policy


def test_dry_run_plans_roles_on_their_own_ranks(tmp_path: Path) -> None:
    """trainer.world_size plans a torchrun world from plain python; nothing is loaded (the model does not exist)."""
    base = [sys.executable, "-m", "torchrl_post.train", "trainer.dry_run=true", f"model.path={tmp_path / 'none'}"]
    proc = run_cmd(base + ["trainer.world_size=4", "placement.actor=[0,1]", "placement.rollout=[2,3]"])
    assert_ok(proc)
    assert "rollout   ranks [2, 3]" in proc.stdout
    assert "weight sync: broadcast over ranks [0, 2, 3] (rank 0 sends)" in proc.stdout
    assert "rollout engines (vllm, tensor_parallel_size=1): [[2], [3]]" in proc.stdout
    assert "samples_per_actor_rank: 64" in proc.stdout
    for bad, needle in (
        (["placement.rollout=[2,4]"], "outside the world of 4"),
        (["placement.rollout=[2]"], "ranks [3] have no role"),
        (["placement.rollout=[1,2,3]"], "partly overlaps"),
        (["placement.rollout=[2,3]", "rollout.tensor_parallel_size=3"], "does not divide the 2 rollout ranks"),
        (["placement.rollout=[2,3]", "data.train_batch_size=3"], "data.train_batch_size=3"),
    ):
        proc = run_cmd(base + ["trainer.world_size=4", "placement.actor=[0,1]", *bad])
        _one_line_error(proc, needle)
