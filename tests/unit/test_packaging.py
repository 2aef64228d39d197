"""The package as a whole: a wheel from `pip wheel .` holds the configs and the console script, and trains elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, read_jsonl


@pytest.mark.e2e
def test_wheel_installs_and_trains_outside_the_repo(
    tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(wheels.glob("torchrl_post-*.whl"))
    inst = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert inst.returncode == 0, inst.stderr[-2000:]
    assert (target / "torchrl_post" / "configs" / "config.yaml").is_file()
    assert (target / "torchrl_post" / "configs" / "vlm.yaml").is_file()
    script = target / "bin" / "torchrl-post-train"
    assert script.is_file()
    env = {**os.environ, "PYTHONPATH": str(target), "TOKENIZERS_PARALLELISM": "false"}
    where = subprocess.run(
        [sys.executable, "-c", "import torchrl_post; print(torchrl_post.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip().startswith(str(target)), where.stdout  # the wheel's copy, not the repo's
    run = elsewhere / "run"
    args = [
        f"model.path={tiny_model}",
        f"data.train_files={task_data[0]}",
        f"data.val_files={task_data[1]}",
        "data.train_batch_size=4",
        "rollout.n=4",
        "rollout.engine=hf",
        "trainer.total_training_steps=1",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        f"trainer.default_local_dir={run}",
    ]
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=1", str(script), *args],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["training/global_step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]
