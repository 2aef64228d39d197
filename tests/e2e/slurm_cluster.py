"""A real Slurm cluster on this one machine, for testing the launch scripts: munged, slurmctld and two slurmd
"virtual nodes" on loopback, every file (config, spool, state, logs, pidfiles, munge socket) under one temporary
directory, the daemons found by `SLURM_CONF` (never /etc/slurm) and stopped by their pidfiles.

The settings are those of shared/notes/slurm-on-one-machine.md (Debian bookworm's Slurm 22.05): node names that
are loopback addresses (`scontrol show hostnames` yields an address torchrun can reach), no cgroups, no
accounting, `slurmd -N <node>` per node with per-node spool/pid/log paths, fake GPUs as character devices
(symlinks to /dev/null) so that `--gpus-per-node` allocates, `MinJobAge=5` so that `sbatch --wait` returns soon.
Ports are picked free, so that two clusters (a CI run beside a developer's) do not meet.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
BINARIES = ["slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "munged"]


def install_reason() -> str | None:
    """Install Debian's Slurm and munge when missing; None when the cluster can run, else why it cannot."""
    if os.geteuid() != 0:
        return "a Slurm cluster on this machine needs root (its daemons run as root and as munge); this is not root"
    if all(shutil.which(b) for b in BINARIES):
        return None
    if not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it with"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:  # a stale package list: refresh it once and try again
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env, timeout=600)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 or not all(shutil.which(b) for b in BINARIES):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"apt-get install {' '.join(PACKAGES)} failed (no package mirror reachable?): {last}"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    """`with SlurmCluster(nodes=2) as c: c.run(["sbatch", ...])`; `c.env` holds SLURM_CONF for any client."""

    def __init__(self, nodes: int = 2, cpus: int = 2, gpus: int = 2) -> None:
        self.nodes = [f"127.0.0.{i + 1}" for i in range(nodes)]
        self.cpus, self.gpus = cpus, gpus
        # Not under pytest's tmp_path: that is 0700 to root, and munged runs as the user munge.
        self.root = Path(tempfile.mkdtemp(prefix="torchrl-slurm-"))
        self.root.chmod(0o755)
        self.conf = self.root / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pidfiles: list[Path] = []
        self.logs: list[Path] = []

    # ---- lifecycle ----
    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._write_config()
        self._start_munge()
        self._start(["slurmctld"], self.root / "run" / "slurmctld.pid", self.root / "log" / "slurmctld.log")
        for node in self.nodes:
            pid, log = self.root / "run" / f"slurmd-{node}.pid", self.root / "log" / f"slurmd-{node}.log"
            # Always `-N <node>`: a bare slurmd maps itself to a node and kills that node's daemon.
            self._start(["slurmd", "-N", node], pid, log)
        self._wait_idle()

    def stop(self) -> None:
        """Cancel the jobs left (a failed test's), SIGTERM every daemon by its pidfile, SIGKILL what is left after
        10 s; then remove the directory."""
        if self.pidfiles:
            self.cancel_all()
        pids = []
        for pidfile in reversed(self.pidfiles):
            try:
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
            except (OSError, ValueError, IndexError):
                continue
        deadline = time.time() + 10
        for pid in pids:
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.pidfiles = []
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- clients ----
    def run(self, args: list[str], timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **kw.pop("env", {})}  # type: ignore[dict-item]
        return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, **kw)  # type: ignore[call-overload]

    def cancel_all(self, timeout: float = 60) -> None:
        """scancel every job and wait for them to go (their steps get SIGTERM, then SIGKILL after KillWait)."""
        deadline = time.time() + timeout
        try:
            while time.time() < deadline:
                proc = self.run(["squeue", "-h", "-o", "%i"], timeout=15)
                jobs = proc.stdout.split()
                if proc.returncode != 0 or not jobs:
                    return
                self.run(["scancel", *jobs], timeout=15)
                time.sleep(1)
        except subprocess.TimeoutExpired:
            return

    def state_and_logs(self) -> str:
        """squeue, sinfo and the daemons' logs, for an assertion message."""
        try:
            queue = self.run(["squeue", "-a"], timeout=15).stdout
            nodes = self.run(["sinfo", "-N"], timeout=15).stdout
        except subprocess.TimeoutExpired:
            queue = nodes = "(timed out)"
        return f"--- squeue\n{queue}--- sinfo\n{nodes}{self.daemon_logs()}"

    def daemon_logs(self, tail: int = 40) -> str:
        """The last lines of every daemon's log, for an assertion message."""
        out = []
        for log in self.logs:
            lines = log.read_text(errors="replace").splitlines() if log.exists() else ["(no log)"]
            out.append(f"--- {log.name}\n" + "\n".join(lines[-tail:]))
        return "\n".join(out)

    # ---- internals ----
    def _write_config(self) -> None:
        r = self.root
        for d in ("etc", "run", "log", "state", "gpu", *(f"spool/{n}" for n in self.nodes)):
            (r / d).mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus):  # gres File= must be a character device
            (r / "gpu" / f"fake{i}").symlink_to("/dev/null")
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        host = socket.gethostname().split(".")[0]
        self.munge_socket = r / "munge" / "munge.socket"
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        nodes = "\n".join(
            f"NodeName={n} NodeAddr=127.0.0.1 Port={p} CPUs={self.cpus} RealMemory=1000{gres} State=UNKNOWN"
            for n, p in zip(self.nodes, node_ports, strict=True)
        )
        self.conf.write_text(
            f"""ClusterName=torchrl
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmdParameters=config_overrides
MailProg=/bin/true
MinJobAge=5
ReturnToService=2
{"GresTypes=gpu" if self.gpus else ""}
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        (r / "etc" / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        if self.gpus:
            files = f"{r}/gpu/fake[0-{self.gpus - 1}]" if self.gpus > 1 else f"{r}/gpu/fake0"
            (r / "etc" / "gres.conf").write_text(f"Name=gpu File={files}\n")

    def _start_munge(self) -> None:
        d = self.root / "munge"
        d.mkdir()
        key = d / "munge.key"
        if Path("/etc/munge/munge.key").exists():
            shutil.copyfile("/etc/munge/munge.key", key)
        else:
            key.write_bytes(os.urandom(128))
        shutil.chown(d, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        key.chmod(0o600)
        d.chmod(0o755)  # munged wants its socket directory searchable by all
        pidfile, log = d / "munged.pid", d / "munged.log"
        self.pidfiles.append(pidfile)
        self.logs.append(log)
        cmd = ["runuser", "-u", "munge", "--", "munged", f"--socket={self.munge_socket}", f"--key-file={key}"]
        cmd += [f"--pid-file={pidfile}", f"--log-file={log}", f"--seed-file={d / 'munged.seed'}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"munged did not start: {proc.stderr.strip()}\n{self.daemon_logs()}")
        _wait_for(pidfile, "munged", self)

    def _start(self, cmd: list[str], pidfile: Path, log: Path) -> None:
        self.pidfiles.append(pidfile)
        self.logs.append(log)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=60)  # daemonizes
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} did not start: {proc.stderr.strip()}\n{self.daemon_logs()}")
        _wait_for(pidfile, cmd[0], self)

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        states: list[str] = []
        while time.time() < deadline:
            proc = self.run(["sinfo", "-h", "-N", "-o", "%N %t"])
            states = proc.stdout.split("\n") if proc.returncode == 0 else [proc.stderr]
            idle = [line for line in states if line.strip().endswith(" idle")]
            if len(idle) == len(self.nodes):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the nodes did not come up: {states}\n{self.daemon_logs()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_for(pidfile: Path, name: str, cluster: SlurmCluster, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} wrote no pidfile {pidfile}\n{cluster.daemon_logs()}")
