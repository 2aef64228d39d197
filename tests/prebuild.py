"""The suite's slowest model builds run in one background process beside the tests, on one thread, while the tests
before them run on the rest of the machine: the demo model (its warm start, about 40 s on 2 quiet cores; it blocked
the session's first test for 75-123 s beside the lint), then the unit tier's demo judge, reward model and
distillation pair (about 2.5 minutes on 2 cores), then the math agent's warm-started model for the e2e tier's last
test (about 80 s on 2 quiet cores, at the lowest priority). The `demo` fixture waits for the demo model's marker, not
for the rest. tests/conftest.py starts the process at the session's first test with the builds its collected tests
read, and moves the unit tests that read them after the distributed tier. Each fixture waits for its build, then
calls its builder, which finds the model built and checks its marker (or builds it there, if the background build
failed: the fixture prints the log's tail). The builds are the fixtures' own: the same functions, directories and
markers, so a model is the same whichever process built it.

    python -m tests.prebuild <what to build, comma-separated FIXTURES> <demo model dir> <demo data dir> <math agent dir>
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = REPO / "outputs"
JUDGE, REWARD_MODEL = OUTPUTS / "demo_judge_model", OUTPUTS / "demo_reward_model"
TEACHER, STUDENT = OUTPUTS / "distill_teacher", OUTPUTS / "distill_student"
DEMO_FIXTURES = ("demo_judge_model", "demo_reward_model", "demo_distill_models")
"""The fixtures built from the session's demo model (its fixture `demo` is built first)."""
MATH_AGENT = "math_agent"
"""The math agent's model: built last and at the lowest priority (read by the suite's last tests), it takes the CPU the
tests leave rather than a share beside them: beside the distributed tier's 4-rank launches it made them twice as slow."""
FIXTURES = (*DEMO_FIXTURES, MATH_AGENT)
"""Every fixture whose model the background process builds, in the order it builds them."""
LOG = OUTPUTS / "prebuild.log"
BUILT = OUTPUTS / "prebuild"
"""Where the process writes `<fixture>.built` once it has built it (cleared when a session starts it)."""
WAIT_S = 1200
"""The longest a fixture waits for the background builds (about 5 minutes on 2 busy cores): past it the process is
killed and the fixture builds its model itself, saying so, rather than wait on a build that hangs."""

_process: subprocess.Popen[bytes] | None = None
_demo_model: list[Path] = []  # the demo model dir the process builds first, when it does
_wanted: list[str] = []  # the fixtures it builds


def start(wanted: list[str], demo: tuple[Path, Path] | None, math_agent: Path) -> None:
    """Start the background builds of the `wanted` fixtures (once per session). `demo`: the session's demo model
    and data (for DEMO_FIXTURES); `math_agent`: the directory the math agent's model and data go under."""
    global _process
    if _process is not None or not wanted:
        return
    OUTPUTS.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    demo_dirs = [str(p) for p in demo] if demo is not None else ["-", "-"]
    _demo_model[:] = [demo[0]] if demo is not None else []
    _wanted[:] = wanted
    shutil.rmtree(BUILT, ignore_errors=True)
    BUILT.mkdir(parents=True)
    with LOG.open("wb") as log:
        _process = subprocess.Popen(
            [sys.executable, "-m", "tests.prebuild", ",".join(wanted), *demo_dirs, str(math_agent)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


def _built(name: str) -> Path:
    return BUILT / f"{name}.built"


def wait(name: str) -> None:
    """Wait for the background build of the fixture `name` (not for the builds after it: the math agent's, at the
    lowest priority, may run to the suite's end), if the process builds it; a failed one is reported (the fixture
    then builds)."""
    if _process is None or name not in _wanted:
        return
    deadline = time.monotonic() + WAIT_S
    while not _built(name).is_file() and _process.poll() is None:
        if time.monotonic() > deadline:
            stop()
            break
        time.sleep(0.5)
    if not _built(name).is_file():
        tail = LOG.read_text(errors="replace").splitlines()[-15:]
        code = _process.poll()
        why = f"exit {code}" if code is not None else f"still running after {WAIT_S} s, killed"
        print(f"background build of {name} failed ({why}); building here:", *tail, sep="\n")


def wait_for_demo(model_dir: Path) -> None:
    """Wait until the background process has written the demo model into `model_dir` (its marker), or has ended;
    at once when the process does not build it."""
    if _process is None or _demo_model != [model_dir]:
        return
    deadline = time.monotonic() + WAIT_S
    while not (model_dir / "demo_build.json").is_file() and _process.poll() is None:
        if time.monotonic() > deadline:  # a build that hangs: killed, so that the fixture's own build is alone
            stop()
            print(f"the background demo build did not finish in {WAIT_S} s; building here", flush=True)
            return
        time.sleep(0.5)


def stop() -> None:
    """Kill the background builds if they still run (the session ends early: a failure under -x, an interrupt)."""
    if _process is not None and _process.poll() is None:
        _process.kill()
        _process.wait()


def _yield_the_machine() -> None:
    """The lowest priority for the rest of this process. Where the kernel groups processes by session (autogroup),
    niceness orders a session's own processes only and each session gets a fair share: this process, in the suite's
    session, took a core beside every launch (each a session of its own). It leads a session of its own then, at
    nice 19."""
    with contextlib.suppress(OSError):  # no autogroup (or no /proc): niceness alone
        os.setsid()
        Path("/proc/self/autogroup").write_text("19")
    os.nice(19)


def build(wanted: list[str], demo_dir: Path, data_dir: Path, math_agent: Path) -> None:
    import torch

    torch.set_num_threads(1)
    if set(wanted) & set(DEMO_FIXTURES):
        from torchrl_post.demo.build import build_demo

        print("building the demo model", flush=True)
        build_demo(demo_dir, data_dir)
    for name in FIXTURES:
        if name not in wanted:
            continue
        print(f"building {name}", flush=True)
        if name == "demo_judge_model":
            from torchrl_post.demo.judge import build_judge

            build_judge(JUDGE, demo_dir, data_dir)
        elif name == "demo_reward_model":
            from torchrl_post.demo.reward_model import build_reward_model

            build_reward_model(REWARD_MODEL, demo_dir, data_dir)
        elif name == "demo_distill_models":
            from torchrl_post.demo.distill import build_distill

            build_distill(TEACHER, STUDENT, demo_dir, data_dir)
        else:
            from torchrl_post.demo.math_agent import build_math_agent

            _yield_the_machine()
            build_math_agent(math_agent / "model", math_agent / "data")
        _built(name).touch()


if __name__ == "__main__":
    build(sys.argv[1].split(","), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
