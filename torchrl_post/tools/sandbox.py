"""Run model-written code in a sandbox: bubblewrap (own network, PID, IPC and mount namespaces, a read-only
system, a scratch directory as the only writable place) under an unprivileged uid with CPU-time, memory,
process-count, file-size and open-file limits, a wall-clock timeout, and truncated output.

    result = run_sandboxed("print(2 + 2)", SandboxLimits())   # SandboxResult(stdout="4\\n", ...)

There is no unsandboxed fallback: without bwrap (`make setup` installs Debian's `bubblewrap` where it can)
`run_sandboxed` raises `SandboxUnavailable` naming the fix. Each call gets its own uid from a pool, because
RLIMIT_NPROC counts every process of a uid (and root ignores it). The process group is killed and reaped and
the scratch directory removed on every exit path, timeouts included.
"""

from __future__ import annotations

import itertools
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

_UIDS = itertools.cycle(range(61000, 61000 + 512))  # unprivileged uids, one per concurrent sandbox
_UID_LOCK = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """The isolation tool is missing or cannot run here; model-written code is refused, never run unsandboxed."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    """Wall-clock limit; the process group is killed after it."""
    cpu_s: int = 5
    """CPU-time limit (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS)."""
    max_processes: int = 16
    """Processes of the sandbox's uid (RLIMIT_NPROC): a fork bomb stops here."""
    max_file_mb: int = 16
    """Largest file the code may write (RLIMIT_FSIZE)."""
    max_output_bytes: int = 4096
    """stdout and stderr are each cut to this many bytes."""
    interpreter: str = "/usr/bin/python3"
    """The Python inside the sandbox (a system one: the sandbox sees /usr read-only, not the venv)."""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    truncated: bool


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "the Python tool runs model-written code only under bubblewrap, and `bwrap` is not installed; "
            "install it (Debian/Ubuntu: apt-get install bubblewrap; `make setup` does this where it can)"
        )
    return path


def _system_binds() -> list[str]:
    """Read-only /usr, with /bin, /lib, /lib64, /sbin as the host has them (symlinks into /usr or directories)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
        p = Path(top)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            args += ["--ro-bind", top, top]
    return args


def _limit(limits: SandboxLimits, uid: int) -> None:
    """In the child before exec: own session (one process group to kill), resource limits, drop to `uid`."""
    os.setsid()
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_mb * mb, limits.max_file_mb * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def run_sandboxed(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` with `limits.interpreter -I` in a fresh sandbox; never raises for what the code does."""
    limits = limits or SandboxLimits()
    bwrap = bwrap_path()
    with _UID_LOCK:
        uid = next(_UIDS) if os.getuid() == 0 else os.getuid()
    scratch = Path(tempfile.mkdtemp(prefix="torchrl_post_sandbox_"))
    try:
        (scratch / "main.py").write_text(code)
        if os.getuid() == 0:
            os.chown(scratch, uid, uid)
        cmd = [
            bwrap,
            "--unshare-all",  # network, PID, IPC, UTS, cgroup, user namespaces
            "--die-with-parent",
            "--new-session",
            *_system_binds(),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--bind",
            str(scratch),
            "/scratch",
            "--chdir",
            "/scratch",
            "--clearenv",
            "--setenv",
            "HOME",
            "/scratch",
            limits.interpreter,
            "-I",
            "main.py",
        ]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lambda: _limit(limits, uid)
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, err = proc.communicate()
        finally:
            _kill_group(proc.pid)  # anything the code left running in its session
        if proc.returncode == 1 and b"bwrap:" in err[:200] and not out:
            raise SandboxUnavailable(f"bubblewrap cannot create its sandbox here: {err.decode(errors='replace')}")
        cut = limits.max_output_bytes
        return SandboxResult(
            out[:cut].decode(errors="replace"),
            err[:cut].decode(errors="replace"),
            proc.returncode,
            timed_out,
            len(out) > cut or len(err) > cut,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
