"""The run directory through the real entrypoint: a second job into a running job's directory is refused in
one line and changes nothing; SIGTERM to the launcher stops the job at a step boundary with a checkpoint, and
the next launch resumes from it; a garbage pointer falls back to the newest checkpoint on disk; an unreadable
checkpoint is named with the previous one offered; a fresh start moves the earlier run's checkpoints aside."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, assert_ok, read_jsonl, torchrun, train_overrides

pytestmark = pytest.mark.e2e

HF = ["rollout.engine=hf", "trainer.test_freq=0"]  # the launcher and the run directory are under test, not vLLM


def _args(model: Path, data: tuple[Path, Path], run: Path, steps: int, *extra: str) -> list[str]:
    return ["-m", "torchrl_post.train", *train_overrides(model, data, run, steps), *HF, *extra]


def test_second_job_refused_and_sigterm_checkpoints(
    tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    first = subprocess.Popen(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", *_args(tiny_model, task_data, run, 500)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while not (run / "metrics.jsonl").exists() or len(read_jsonl(run / "metrics.jsonl")) < 2:
            assert first.poll() is None and time.time() < deadline, "the first job did not start training"
            time.sleep(0.5)
        second = torchrun(2, _args(tiny_model, task_data, run, 2, "trainer.resume_mode=disable"))
        assert second.returncode != 0
        assert f"error: trainer.default_local_dir='{run}' is in use by job " in second.stderr
        assert "Loading" not in second.stderr.split("error:")[0]  # refused before any model loaded
        assert not list(run.glob("metrics.*.old")) and not list(run.glob("checkpoints.*.old"))
        assert first.poll() is None  # the first job goes on
        os.kill(first.pid, signal.SIGTERM)  # what Slurm and Kubernetes send to the launcher before a kill
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    stopped = [line for line in out.splitlines() if line.startswith("stopped on SIGTERM after step")]
    assert stopped, out[-3000:]
    step = int(stopped[0].split("after step ")[1].split(":")[0])
    assert (run / "checkpoints" / f"global_step_{step}" / "trainer_state.json").is_file()
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == str(step)
    resumed = torchrun(2, _args(tiny_model, task_data, run, step + 1))  # the lock went with the first job
    assert_ok(resumed)
    assert f"resumed from {run / 'checkpoints' / f'global_step_{step}'} (step {step})" in resumed.stderr


def test_pointer_corruption_and_fresh_start(tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path) -> None:
    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    assert_ok(torchrun(2, _args(tiny_model, task_data, run, 2, "trainer.save_freq=1")))
    (ckpts / "latest_checkpointed_iteration.txt").write_text("\x00garbage")
    proc = torchrun(2, _args(tiny_model, task_data, run, 3, "trainer.save_freq=1"))
    assert_ok(proc)
    assert "using the newest complete checkpoint on disk, global_step_2" in proc.stderr
    assert "(step 2)" in proc.stderr  # resumed from it
    (ckpts / "global_step_3" / "trainer_state.json").write_text('{"global_step": 3, "world')  # torn write
    proc = torchrun(2, _args(tiny_model, task_data, run, 4))
    assert proc.returncode != 0
    line = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "global_step_3/trainer_state.json cannot be read" in line[0], proc.stderr[-2000:]
    assert f"trainer.resume_from_path={ckpts / 'global_step_2'}" in line[0]
    # Found after the models and the engine were built: teardown adds nothing after the line (no exit-handler
    # traceback from vLLM), only torchrun's own report follows it.
    after = proc.stderr.split(line[0], 1)[1]
    assert "Invalid process group" not in after and "Exception ignored" not in after and "[rank" not in after
    # A fresh start into this directory, keeping one checkpoint: the earlier run's are moved aside, whole.
    fresh = ["trainer.save_freq=1", "trainer.resume_mode=disable", "trainer.max_ckpt_to_keep=1"]
    assert_ok(torchrun(2, _args(tiny_model, task_data, run, 2, *fresh)))
    old = tmp_path / "run" / "checkpoints.1.old"
    assert sorted(p.name for p in old.glob("global_step_*")) == ["global_step_1", "global_step_2", "global_step_3"]
    assert sorted(p.name for p in ckpts.glob("global_step_*")) == ["global_step_2"]  # pruned: this run's only
    assert (ckpts / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    # The earlier history (steps 1-2, then 3 resumed; the refused resume logged nothing) is kept aside whole, not
    # appended to or deleted; this run's metrics start over.
    assert [p.name for p in run.glob("metrics.*.jsonl.old")] == ["metrics.1.jsonl.old"]
    assert [r["training/global_step"] for r in read_jsonl(run / "metrics.1.jsonl.old")] == [1, 2, 3]
    assert [r["training/global_step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]


def test_full_disk_during_save_is_one_line(tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = torchrun(
        2,
        _args(tiny_model, task_data, run, 4, "trainer.save_freq=2"),
        env={"TORCHRL_POST_FAULT": "enospc_during_save:4"},
    )
    assert proc.returncode != 0
    line = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "No space left on device" in line[0], proc.stderr[-2000:]
    assert f"the previous checkpoint {run / 'checkpoints' / 'global_step_2'} is intact" in line[0]
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    resumed = torchrun(2, _args(tiny_model, task_data, run, 4, "trainer.save_freq=2"))
    assert_ok(resumed)
    assert "(step 2)" in resumed.stderr
