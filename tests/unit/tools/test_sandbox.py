"""Tests of torchrl_post/tools/sandbox.py: each isolation claim attacked by real code."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.unit.tools.helpers import needs_bwrap
from torchrl_post.tools.sandbox import SandboxLimits, SandboxUnavailable, run_sandboxed


def _own_processes_left(marker: str) -> int:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return sum(marker in line for line in out.splitlines())


def test_without_bwrap_the_executor_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_sandboxed("print(1)")


@needs_bwrap
def test_runs_code_and_returns_its_output_as_an_unprivileged_user() -> None:
    r = run_sandboxed("import os\nprint(2 + 2, os.getuid() != 0)")
    assert (r.stdout, r.returncode, r.timed_out) == ("4 True\n", 0, False)


@needs_bwrap
def test_no_network() -> None:
    code = "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n    print('reached')\nexcept OSError:\n    print('blocked')"
    assert run_sandboxed(code).stdout == "blocked\n"


@needs_bwrap
def test_fork_bomb_is_bounded_and_reaped() -> None:
    code = (
        "import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError:\n"
        "        print('refused after', n)\n        break\n    if pid == 0:\n        time.sleep(60)  # fork-bomb-child\n"
        "        os._exit(0)\n    n += 1"
    )
    r = run_sandboxed(code, SandboxLimits(max_processes=8))
    assert r.stdout.startswith("refused after") and int(r.stdout.split()[-1]) < 8
    time.sleep(0.2)
    assert _own_processes_left("main.py") == 0  # the sleeping children were killed with the sandbox


@needs_bwrap
def test_memory_limit() -> None:
    r = run_sandboxed("x = bytearray(2_000_000_000)", SandboxLimits(memory_mb=256))
    assert r.returncode != 0 and "MemoryError" in r.stderr


@needs_bwrap
def test_infinite_loops_end_by_cpu_or_wall_clock() -> None:
    t = time.perf_counter()
    busy = run_sandboxed("while True: pass", SandboxLimits(cpu_s=1, wall_s=20))
    assert busy.returncode != 0 and time.perf_counter() - t < 10  # RLIMIT_CPU kills it
    asleep = run_sandboxed("import time\ntime.sleep(60)", SandboxLimits(wall_s=1))
    assert asleep.timed_out  # no CPU used: the wall clock ends it


@needs_bwrap
def test_writes_only_in_scratch_and_output_is_cut() -> None:
    r = run_sandboxed("open('/usr/x', 'w')")
    assert "Read-only file system" in r.stderr
    ok = run_sandboxed("open('f.txt', 'w').write('hi')\nprint(open('f.txt').read())")
    assert ok.stdout == "hi\n"
    long = run_sandboxed("print('a' * 10000)", SandboxLimits(max_output_bytes=100))
    assert long.truncated and len(long.stdout) == 100
