"""The launch scripts, for real: `launch/slurm/train.sbatch` on a Slurm cluster on this machine (a controller and
two slurmd virtual nodes on loopback, `tests/e2e/slurm_cluster.py`) and `launch/run.sh` as two torchrun agents
(`--nnodes 2`, c10d rendezvous) without Slurm.

- A 2-node Slurm job trains (global ranks 0,1 on the first node, 2,3 on the second, processes per node from the
  allocation's GPUs), writes metrics and a checkpoint under <job's working dir>/outputs/<job name>; a second
  submission resumes from it.
- The time-limit warning (the SIGUSR1 that `--signal=B:USR1@120` sends) makes the trainer checkpoint and the job
  requeue itself; the requeued job resumes from that checkpoint by itself; a scancel checkpoints again.
- Two torchrun agents with `placement.rollout=[2,3]`: the vLLM engines run under the second agent, the actor
  under the first, and the weights cross between them by the broadcast sync.

Slurm is Debian's (`slurmctld slurmd slurm-client munge`), installed here when missing; the Slurm tests skip,
with the reason, only where that cannot be done (not root, no apt-get, no package mirror).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, read_jsonl, run_cmd, train_overrides
from tests.e2e.slurm_cluster import SlurmCluster, install_reason

pytestmark = pytest.mark.e2e

RUN_SH = REPO / "launch" / "run.sh"
SBATCH = REPO / "launch" / "slurm" / "train.sbatch"
HF = ["rollout.engine=hf", "trainer.test_freq=0"]  # the launchers are under test here, not vLLM
# Variables the launch scripts read: never taken from the environment pytest runs in.
LAUNCH_VARS = {"NPROC_PER_NODE", "NNODES", "NODE_RANK", "RDZV_ENDPOINT", "RDZV_ID", "RDZV_PORT", "LOCAL_ADDR"}
LAUNCH_VARS |= {"MAX_RESTARTS", "SHUTDOWN_TIMEOUT", "LOG_DIR", "AUTO_REQUEUE", "TORCHRL_POST_ROOT"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(base: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in LAUNCH_VARS and not k.startswith("SLURM_JOB")}
    env |= {"PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", "TORCHRL_POST_PYTHON": sys.executable}
    return env | extra


def _wait(cond: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what()
        time.sleep(0.5)


def _steps(run: Path) -> list[int]:
    """The steps in metrics.jsonl; [] while it is missing or being rewritten (a resume drops rows)."""
    try:
        return [int(r["training/global_step"]) for r in read_jsonl(run / "metrics.jsonl")]
    except (OSError, ValueError, KeyError):
        return []


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# ---------------------------------------------------------------------------------------------------------------
# launch/run.sh alone


def test_scripts_parse_and_run_sh_builds_the_torchrun_command() -> None:
    for script in (RUN_SH, SBATCH, REPO / "launch" / "slurm" / "gpu_example.sbatch"):
        assert os.access(script, os.X_OK), f"{script} is not executable"
        proc = run_cmd(["bash", "-n", str(script)])
        assert proc.returncode == 0, proc.stderr
    env = _env(dict(os.environ), CUDA_VISIBLE_DEVICES="")
    one = run_cmd([str(RUN_SH), "--print", "--nproc-per-node", "3", "--config-name", "math_agent", "a.b=1"], env=env)
    assert one.returncode == 0, one.stderr
    assert "--nproc-per-node 3" in one.stderr and "--standalone" in one.stderr
    assert one.stderr.rstrip().endswith("-m torchrl_post.train --config-name math_agent a.b=1")
    env |= {"NNODES": "2", "NODE_RANK": "1", "RDZV_ENDPOINT": "head:29400", "SLURM_JOB_ID": "77"}
    two = run_cmd([str(RUN_SH), "--print", "--local-addr=node2", "--", "--print", "x=[0,1]"], env=env)
    assert two.returncode == 0, two.stderr
    assert "node 1 of 2" in two.stderr and "--nproc-per-node 2" in two.stderr  # no GPU: 2 processes
    for part in ("--nnodes 2", "--rdzv-backend c10d", "--rdzv-endpoint head:29400", "--rdzv-id 77"):
        assert part in two.stderr
    assert "--local-addr node2" in two.stderr and "--standalone" not in two.stderr
    assert two.stderr.rstrip().endswith(r"-m torchrl_post.train --print x=\[0\,1\]")  # after --: the trainer's
    bad = run_cmd([str(RUN_SH), "--print", "--nnodes", "2"], env=_env(dict(os.environ)))
    assert bad.returncode == 2 and "needs --rdzv-endpoint HOST:PORT" in bad.stderr


# ---------------------------------------------------------------------------------------------------------------
# Multi-node without Slurm: two torchrun agents on this machine


@pytest.mark.vllm
def test_two_torchrun_agents_train_with_the_rollout_on_the_second_node(
    tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """Two `launch/run.sh --nnodes 2` agents (2 processes each) meet at a c10d rendezvous; each names itself by a
    loopback address (`--local-addr`), which fixes the node order. The actor is on the first node's ranks, the
    two vLLM engines on the second's."""
    run = tmp_path / "run"
    args = train_overrides(tiny_model, task_data, run, 2) + ["trainer.test_freq=0"]
    args += ["placement.actor=[0,1]", "placement.rollout=[2,3]"]
    endpoint = f"127.0.0.1:{_free_port()}"
    procs: dict[int, subprocess.Popen[bytes]] = {}
    logs = {node: tmp_path / f"node{node}.log" for node in (0, 1)}
    try:
        for node in (1, 0):  # the second node first: the order they start in does not matter
            env = _env(
                dict(os.environ),
                NNODES="2",
                NODE_RANK=str(node),
                NPROC_PER_NODE="2",
                RDZV_ENDPOINT=endpoint,
                RDZV_ID="two-agents",
                LOCAL_ADDR=f"127.0.0.{node + 1}",
                LOG_DIR=str(tmp_path / f"torchrun{node}"),
            )
            with logs[node].open("wb") as out:
                procs[node] = subprocess.Popen(
                    [str(RUN_SH), *args],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        for proc in procs.values():
            proc.wait(timeout=420)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    out = {node: _text(log) for node, log in logs.items()}
    report = "\n".join(f"--- node {n}\n{text[-6000:]}" for n, text in out.items())
    assert [procs[0].returncode, procs[1].returncode] == [0, 0], report
    assert "global_ranks=[0, 1]" in out[0] and "global_ranks=[2, 3]" in out[1], report
    # The engines are the second node's: its ranks 2 and 3 start vLLM; the first node's ranks never do.
    engine_lines = [line for line in out[1].splitlines() if re.match(r"\[rank[23]\]:.*vllm", line, re.IGNORECASE)]
    assert engine_lines, report
    assert "vllm" not in out[0].lower(), report
    rows = read_jsonl(run / "metrics.jsonl")
    assert [int(r["training/global_step"]) for r in rows] == [1, 2]
    # After each update the weights went from the first node to the engines on the second: the engines'
    # logprobs are the trainer's.
    assert all(r["rollout/logprob_diff"] < 1e-3 for r in rows), [r["rollout/logprob_diff"] for r in rows]
    assert (run / "checkpoints" / "global_step_2" / "trainer_state.json").is_file()


# ---------------------------------------------------------------------------------------------------------------
# Slurm


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    reason = install_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = SlurmCluster(nodes=2, cpus=2, gpus=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()  # jobs cancelled, daemons stopped by their pidfiles: also when a test failed


class Job:
    """One submission of launch/slurm/train.sbatch from the repository root, working in `work`."""

    def __init__(
        self,
        cluster: SlurmCluster,
        work: Path,
        name: str,
        sbatch: list[str],
        args: list[str],
        wait: bool,
        **env: str,
    ) -> None:
        self.cluster, self.work, self.name = cluster, work, name
        cmd = ["sbatch", "--parsable", *(["--wait"] if wait else []), f"--chdir={work}", f"--job-name={name}"]
        cmd += [*sbatch, str(SBATCH), *args]
        env = _env(cluster.env, RDZV_PORT=str(_free_port()), **env)
        self.proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        self.id = (self.proc.stdout.split() or ["?"])[0].split(";")[0]
        self.logs = work / "logs" / f"{name}-{self.id}"
        self.run = work / "outputs" / name

    def log(self, name: str) -> str:
        return _text(self.logs / name)

    def state(self) -> str:
        proc = self.cluster.run(["scontrol", "show", "job", self.id])
        return proc.stdout if proc.returncode == 0 else ""

    def report(self) -> str:
        parts = [f"sbatch exit {self.proc.returncode}: {self.proc.stdout}{self.proc.stderr}"]
        parts.append(f"--- {self.name}-{self.id}.out\n{_text(self.work / f'{self.name}-{self.id}.out')}")
        parts.append(f"--- job.log\n{self.log('job.log')}")
        for node in ("node0.log", "node1.log"):
            parts.append(f"--- {node}\n{self.log(node)[-5000:]}")
        parts.append(self.cluster.state_and_logs())
        return "\n".join(parts)


def _args(model: Path, data: tuple[Path, Path], steps: int, *extra: str) -> list[str]:
    """train_overrides without the run directory: the job's default (outputs/<job name>) is under test."""
    args = [a for a in train_overrides(model, data, Path("unused"), steps) if "default_local_dir" not in a]
    return [*args, *HF, *extra]


def test_two_node_job_trains_and_a_second_submission_resumes(
    slurm: SlurmCluster, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    # No NPROC_PER_NODE: the processes per node come from the allocation's (fake) GPUs.
    first = Job(slurm, work, "grpo", ["--nodes=2", "--gpus-per-node=2"], _args(tiny_model, task_data, 2), wait=True)
    assert first.proc.returncode == 0, first.report()
    assert "2 node(s)" in first.log("job.log") and "processes per node 2" in first.log("job.log"), first.report()
    node0, node1 = first.log("node0.log"), first.log("node1.log")
    assert "global_ranks=[0, 1]" in node0 and "global_ranks=[2, 3]" in node1, first.report()
    for rank in (0, 1):
        assert f"[rank{rank}]:" in node0 and f"[rank{rank}]:" not in node1, first.report()
    for rank in (2, 3):
        assert f"[rank{rank}]:" in node1 and f"[rank{rank}]:" not in node0, first.report()
    run = first.run  # <job's working directory>/outputs/<job name>
    assert _steps(run) == [1, 2], first.report()
    assert (run / "checkpoints" / "global_step_2" / "trainer_state.json").is_file()
    assert list((first.logs / "node1").rglob("stdout.log")), "torchrun's per-rank logs are in the job's log dir"

    # The same job name again, on CPU (NPROC_PER_NODE): it finds the checkpoint and resumes.
    second = Job(slurm, work, "grpo", ["--nodes=2"], _args(tiny_model, task_data, 4), wait=True, NPROC_PER_NODE="2")
    assert second.proc.returncode == 0, second.report()
    assert second.id != first.id and second.run == run
    assert f"resumed from {run / 'checkpoints' / 'global_step_2'} (step 2)" in second.log("node0.log"), second.report()
    assert _steps(run) == [1, 2, 3, 4]
    assert (run / "checkpoints" / "global_step_4" / "trainer_state.json").is_file()


def test_time_limit_signal_checkpoints_requeues_and_resumes(
    slurm: SlurmCluster, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    args = _args(tiny_model, task_data, 1000, "trainer.save_freq=0")  # checkpoints only when stopped
    job = Job(slurm, work, "long", ["--nodes=2"], args, wait=False, NPROC_PER_NODE="2")
    assert job.proc.returncode == 0, job.report()
    ckpts = job.run / "checkpoints"
    _wait(lambda: len(_steps(job.run)) >= 2, 240, job.report)

    # What `#SBATCH --signal=B:USR1@120` sends the batch script 120 s before the time limit.
    assert slurm.run(["scancel", "--batch", "--signal=USR1", job.id]).returncode == 0
    _wait(lambda: "Restarts=1" in job.state(), 120, job.report)  # the script requeued the job
    assert "time limit near" in job.log("job.log") and f"requeueing job {job.id}" in job.log("job.log")
    stops = re.findall(r"stopped on SIGTERM after step (\d+): checkpoint", job.log("node0.log"))
    assert len(stops) == 1, job.report()
    first_stop = int(stops[0])
    assert (ckpts / f"global_step_{first_stop}" / "trainer_state.json").is_file()
    assert sorted(p.name for p in ckpts.glob("global_step_*")) == [f"global_step_{first_stop}"]

    # Slurm holds a requeued job for its begin time (about 2 minutes) while the nodes let go of its first run
    # (a credential issued in the second its predecessor was revoked is refused): start it once they have.
    pending_since: list[float] = []

    def resumed_and_trained() -> bool:
        if "JobState=PENDING" in job.state():
            pending_since.append(time.time())
            idle = slurm.run(["sinfo", "-h", "-N", "-o", "%t"]).stdout.split() == ["idle"] * 2
            if idle and time.time() - pending_since[0] > 3:
                slurm.run(["scontrol", "update", f"JobId={job.id}", "StartTime=now"])
        return max(_steps(job.run), default=0) > first_stop + 1

    _wait(resumed_and_trained, 240, job.report)
    resumed = f"resumed from {ckpts / f'global_step_{first_stop}'} (step {first_stop})"
    assert resumed in job.log("node0.log"), job.report()

    # scancel (as preemption or `scontrol requeue`): SIGTERM to the job steps, a checkpoint within KillWait.
    assert slurm.run(["scancel", job.id]).returncode == 0
    _wait(lambda: "JobState=" not in job.state() or "JobState=CANCELLED" in job.state(), 120, job.report)
    _wait(lambda: len(re.findall(r"stopped on SIGTERM after step", job.log("node0.log"))) == 2, 60, job.report)
    second_stop = int(re.findall(r"stopped on SIGTERM after step (\d+): checkpoint", job.log("node0.log"))[1])
    assert second_stop > first_stop
    assert (ckpts / f"global_step_{second_stop}" / "trainer_state.json").is_file()
    assert (ckpts / "latest_checkpointed_iteration.txt").read_text().strip() == str(second_stop)
    assert _steps(job.run) == list(range(1, second_stop + 1))  # one history across the restart
    out = _text(work / f"long-{job.id}.out")
    assert "(restart 0)" in out and "(restart 1)" in out, out
