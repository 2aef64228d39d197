"""The suite's torchrun without the imports: one process (the zygote) imports torch, transformers, vLLM and the
trainer once, then forks each launch's ranks with the environment torchrun gives its workers.

A torchrun launch of the entrypoint spends most of its seconds importing (about 8 s of a 16 s 2-rank, 1-step run
on 2 cores: torch, torch.distributed.tensor, transformers, vLLM), the same modules every time. Here each launch is
a session of its own (its ranks' process group, killed whole on a timeout) whose ranks are forked from the
zygote after those imports: `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT`,
`TORCHELASTIC_RESTART_COUNT`, `OMP_NUM_THREADS=1` set as torchrun sets them, and the target run as `python -m
module args` or `python script args` would run it. As torchrun's agent does, the first rank that fails stops the
others (SIGTERM, then SIGKILL after 30 s) and the launch exits 1.

What torchrun's agent adds stays with the tests that are about it: restarts (`--max-restarts`), its rendezvous,
the launch scripts (tests/e2e/test_launch.py, test_recovery.py) run the real `torchrun`. `tests.conftest.torchrun`
chooses (`real=True`). The zygote imports nothing from a test, and a rank imports what its target needs on top.

A plain `python -m module args` or `python script args` of a test (`tests.conftest.run_cmd`) is forked the same
way, as one process without torchrun's environment (`nproc` 0): a dry run or a bad input's one line of the
entrypoint takes a second instead of its imports' four to seven.

Protocol (one launch at a time, as the suite runs them): a JSON line per request on the zygote's stdin
`{"nproc", "target", "env", "cwd", "out", "err"}` (env: the whole environment); it answers `{"pgid"}` when the ranks
start and `{"rc"}` when they end.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

PRELOAD = (
    "torchrl_post.engines.vllm",  # first: it sets vLLM's environment before vLLM is imported
    "transformers",
    "vllm",
    "vllm.entrypoints.llm",
    # What each rank's engine imported on its own (about 2 s a rank on 2 cores): vLLM's CPU worker, model runner
    # and their model-executor layers, quantization and kernel registry, imported when the engine starts.
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.core.sched.scheduler",
    "vllm.model_executor.model_loader",
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.distributed.elastic_ep.elastic_execute",
    "vllm.distributed.device_communicators.cpu_communicator",
    "vllm.model_executor.layers.quantization.online",
    "vllm.utils.cpu_triton_utils",
    "compressed_tensors",
    # The architectures the suite's tiny models use, in transformers (the trainer) and vLLM (the engine).
    *(f"transformers.models.{m}.modeling_{m}" for m in ("qwen2", "llama", "qwen3", "qwen2_moe", "qwen3_moe")),
    *(f"transformers.models.{m}.modeling_{m}" for m in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")),
    *(f"vllm.model_executor.models.{m}" for m in ("qwen2", "llama", "qwen3", "qwen2_moe", "qwen3_moe")),
)
"""Imported by the zygote before it forks a launch, after every module of the package (`_package_modules`)."""
STOP_GRACE_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _package_modules() -> list[str]:
    """Every module of torchrl_post but those a launch runs as `-m` (a script's `__main__`: runpy warns when it is
    already imported); the rest were each imported by some rank of the suite (the placements, roles, engines)."""
    package = Path(__file__).resolve().parents[1] / "torchrl_post"
    names = []
    for path in sorted(package.rglob("*.py")):
        if '__name__ == "__main__"' in path.read_text():
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _preload() -> None:
    import importlib

    # Set before the imports, as torchrun sets it for its workers (libgomp reads it when it loads; a launch of one
    # process sets its threads back), and as torchrl_post/engines/vllm.py sets vLLM's before it imports vLLM.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    for name in (*PRELOAD[:1], *_package_modules(), *PRELOAD[1:]):
        try:
            importlib.import_module(name)
        except ImportError:  # vLLM is not on the GPU machine: its launches import what they need themselves
            continue
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401  (the lazy modules behind them)


def _run_target(target: list[str]) -> None:
    """What `python <target...>` runs: `-m module args` or `script args`."""
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(target)
        sys.path.insert(0, str(Path(target[0]).resolve().parent))
        runpy.run_path(target[0], run_name="__main__")


def _rank(rank: int, nproc: int, port: int, target: list[str]) -> None:
    """One rank, in the forked child: torchrun's worker environment (none for a plain process, `nproc` 0), then the
    target; never returns."""
    if nproc:
        os.environ.update(
            RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_NAME="default",
            WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), ROLE_WORLD_SIZE=str(nproc), GROUP_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_RUN_ID="zygote",
        )  # fmt: skip
    if "OMP_NUM_THREADS" not in os.environ:  # one process: torchrun leaves it the machine's threads
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    code = 0
    try:  # as the interpreter ends a script: SystemExit's code or message, an exception through sys.excepthook
        _run_target(target)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
        code = 1
    if not nproc:  # a plain process runs its exit handlers (a torchrun launch's ranks leave theirs, as before)
        import atexit

        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _leader(request: dict[str, Any]) -> None:
    """The launch, in a forked child that leads a session of its own: fork the ranks, wait, stop the rest when one
    fails; never returns."""
    os.setsid()
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    nproc, port = int(request["nproc"]), _free_port()
    os.environ.clear()  # the environment the test would have given torchrun, whole
    os.environ.update(request["env"])
    if nproc > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it
    os.chdir(request["cwd"])
    ranks = {}
    for rank in range(max(nproc, 1)):  # nproc 0: one plain process, as `python <target>` runs
        pid = os.fork()
        if pid == 0:
            _rank(rank, nproc, port, request["target"])
        ranks[pid] = rank
    failed, deadline = False, float("inf")
    while ranks:
        if time.monotonic() > deadline:
            for pid in ranks:
                os.kill(pid, signal.SIGKILL)
        pid, status = os.waitpid(-1, os.WNOHANG) if failed else os.waitpid(-1, 0)
        if pid == 0:
            time.sleep(0.1)
            continue
        rank = ranks.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if not nproc:  # a plain process: its own exit code
            os._exit(code if code >= 0 else 128 - code)
        if code != 0 and not failed:
            failed, deadline = True, time.monotonic() + STOP_GRACE_S
            print(f"launcher: rank {rank} exited with {code}; stopping the others", file=sys.stderr, flush=True)
            for other in ranks:
                os.kill(other, signal.SIGTERM)
    os._exit(1 if failed else 0)


def serve() -> None:
    """The zygote: preload, then one launch per request line until stdin closes."""
    _preload()
    reply = sys.stdout
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _leader(request)
        print(json.dumps({"pgid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)


class Zygote:
    """The client side, in pytest: start the zygote (its imports overlap whatever runs meanwhile), then launch."""

    def __init__(self, env: dict[str, str], cwd: Path, logs: Path) -> None:
        self._logs, self._cwd, self._env = logs, cwd, env
        self._count = 0
        self._start()

    def _start(self) -> None:
        self._since = time.time()  # the package's sources it imported are at most this new
        logs, cwd, env = self._logs, self._cwd, self._env
        with open(logs / "zygote.err", "w") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.launcher"], cwd=cwd, env=env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            )  # fmt: skip
        self._ready = False

    def _read(self, out: TextIO) -> dict[str, Any]:
        line = out.readline()
        if not line:
            tail = (self._logs / "zygote.err").read_text()[-3000:]
            raise RuntimeError(f"the test launcher's zygote ended (exit {self._proc.poll()}):\n{tail}")
        return dict(json.loads(line))

    def _stale(self) -> bool:
        """A source of the package changed since the zygote imported it (an edit during a session): its ranks would
        run old modules beside new ones."""
        package = self._cwd / "torchrl_post"
        return any(f.stat().st_mtime > self._since for f in package.rglob("*.py"))

    def launch(
        self, nproc: int, target: list[str], timeout: float, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        if self._stale():
            self.close()
            self._start()
        assert self._proc.stdin is not None and self._proc.stdout is not None
        if not self._ready:
            assert self._read(self._proc.stdout).get("ready"), "the test launcher's zygote did not start"
            self._ready = True
        self._count += 1
        out, err = self._logs / f"launch{self._count}.out", self._logs / f"launch{self._count}.err"
        request = {"nproc": nproc, "target": target, "env": env, "out": str(out), "err": str(err),
                   "cwd": str(self._cwd)}  # fmt: skip
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        pgid = int(self._read(self._proc.stdout)["pgid"])
        killer = _Timer(timeout, pgid)
        try:
            rc = int(self._read(self._proc.stdout)["rc"])
        finally:
            killer.cancel()
        args = ["zygote", f"--nproc-per-node={nproc}" if nproc else "python", *target]
        if killer.fired:
            raise subprocess.TimeoutExpired(args, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(args, rc, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


class _Timer:
    """Kill a launch's whole session (leader and ranks) after `timeout` seconds."""

    def __init__(self, timeout: float, pgid: int) -> None:
        import threading

        self.fired = False
        self._pgid = pgid
        self._timer = threading.Timer(timeout, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        try:
            os.killpg(self._pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


if __name__ == "__main__":
    serve()
