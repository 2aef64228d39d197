"""The GPU tier's options, its runner (one per session) and its report, written once at the end of the session.

    --gpu-check          the `make gpu-check` command: without a CUDA device print one line and exit 0, before
                         anything is collected (no report)
    --gpu-device cpu     the plumbing on CPU in float32 (gloo for NCCL; report under outputs/gpu_check/results)
    --gpu-budget S       seconds for the whole list (default 570)
    --gpu-results DIR    where the report goes (default benchmarks/results; cpu: outputs/gpu_check/results)

Without a CUDA device (and without `--gpu-device cpu`) every check is skipped in the `gpu_runner` fixture, before
anything is started: the normal suite (`pytest tests`) skips this tier in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu import driver

RUNNER = pytest.StashKey[driver.Runner]()
REPORT = pytest.StashKey[Path]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpu", "the GPU tier (tests/gpu, make gpu-check)")
    group.addoption(
        "--gpu-check",
        action="store_true",
        help="the make gpu-check command: without a CUDA device print one line and exit 0 (nothing collected)",
    )
    group.addoption(
        "--gpu-device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: the checks' plumbing on CPU in float32 (report under outputs/gpu_check/results)",
    )
    group.addoption("--gpu-budget", type=float, default=driver.BUDGET_S, help="seconds for the whole list")
    group.addoption("--gpu-results", type=Path, default=None, help="the report's folder (default benchmarks/results)")


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """`--gpu-check` on a machine without a CUDA device: the one line, exit 0, no session."""
    if config.getoption("gpu_check") and config.getoption("gpu_device") == "cuda":
        line = driver.no_gpu_line()
        if line is not None:
            print(line, flush=True)
            return 0
    return None


@pytest.fixture(scope="session")
def gpu_runner(request: pytest.FixtureRequest) -> driver.Runner:
    """The session's runner (its budget counted from the first check), or a skip when no CUDA device is visible."""
    device = request.config.getoption("gpu_device")
    if device == "cuda" and (reason := driver.no_gpu_reason()) is not None:
        pytest.skip(reason)
    runner = driver.Runner(device, request.config.getoption("gpu_budget"))
    request.config.stash[RUNNER] = runner
    return runner


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The report of every check that reached the runner (none: no report)."""
    runner = session.config.stash.get(RUNNER, None)
    if runner is not None and runner.records:
        session.config.stash[REPORT] = driver.write(runner, session.config.getoption("gpu_results"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    path = config.stash.get(REPORT, None)
    if path is not None:
        terminalreporter.write_line(driver.summary(path))
