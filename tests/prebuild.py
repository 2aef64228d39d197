"""The unit tier's three demo-model builds (the judge, the reward model, the distillation pair: about 2.5 minutes
on 2 cores) run in one background process beside the tests, on one thread, while the unit tier's other tests run
on the rest of the machine (tests/conftest.py starts it after the session's demo model is built and moves the
tests that read those models to the end of their tier). Each fixture waits for the process, then calls its
builder, which finds the model built and checks its marker (or builds it there, if the background build failed:
the log says why). The builds are the fixtures' own: the same functions, the same output directories, the same
markers, so a model is the same whichever process built it.

    python -m tests.prebuild <demo model dir> <demo data dir>
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = REPO / "outputs"
JUDGE, REWARD_MODEL = OUTPUTS / "demo_judge_model", OUTPUTS / "demo_reward_model"
TEACHER, STUDENT = OUTPUTS / "distill_teacher", OUTPUTS / "distill_student"
FIXTURES = ("demo_judge_model", "demo_reward_model", "demo_distill_models")
"""The fixtures whose models the background process builds."""
LOG = OUTPUTS / "prebuild.log"

_process: subprocess.Popen[bytes] | None = None


def start(demo_dir: Path, data_dir: Path) -> None:
    """Start the background builds (once per session)."""
    global _process
    if _process is not None:
        return
    OUTPUTS.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with LOG.open("wb") as log:
        _process = subprocess.Popen(
            [sys.executable, "-m", "tests.prebuild", str(demo_dir), str(data_dir)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


def wait() -> None:
    """Wait for the background builds, if any were started; a failed one is reported (the fixture then builds)."""
    if _process is None:
        return
    if _process.wait() != 0:
        tail = LOG.read_text(errors="replace").splitlines()[-15:]
        print(f"background demo-model builds failed (exit {_process.returncode}); building here:", *tail, sep="\n")


def build_all(demo_dir: Path, data_dir: Path) -> None:
    import torch

    from torchrl_post.demo.distill import build_distill
    from torchrl_post.demo.judge import build_judge
    from torchrl_post.demo.reward_model import build_reward_model

    torch.set_num_threads(1)
    build_judge(JUDGE, demo_dir, data_dir)
    build_reward_model(REWARD_MODEL, demo_dir, data_dir)
    build_distill(TEACHER, STUDENT, demo_dir, data_dir)


if __name__ == "__main__":
    build_all(Path(sys.argv[1]), Path(sys.argv[2]))
