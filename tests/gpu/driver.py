"""The GPU tier's driver: the checks, their skip rules, each in a process of its own under a time limit, the
budget of the whole list, and the report. tests/gpu/test_gpu.py runs one test per check through it and
tests/gpu/conftest.py writes the report at the end of the session; `make gpu-check` is

    python -m pytest tests/gpu --gpu-check -v [-k NAME] [--gpu-budget 570] [--gpu-results DIR] [--gpu-device cpu]

Each check runs in a child process of its own (`python -m tests.gpu.checks NAME`: a hung NCCL call or a CUDA
error cannot take the others down, and the peaks of one do not mix with the next), under a time limit that is
the check's own or what is left of the whole budget, whichever is less. Each gives a record {name, status:
passed | failed | skipped, reason, numbers, seconds}. A check whose package is missing (vLLM, flash-attn, TRL,
the memory plan) or that needs more GPUs than are visible is skipped with that reason, never failed; one the
budget no longer allows is failed (the list did not run in its time). The report goes to
`<results>/gpu_check_<machine>_<date>.{json,md,png}`; pytest's exit status is 1 when any check failed, else 0.

Without a CUDA device every check is skipped with one reason, and `--gpu-check` (the command) prints one line
and exits 0 (no report). `--gpu-device cpu` runs the same plumbing on CPU in float32 for a machine without a GPU
(the checks' numbers then say nothing about a GPU; the report goes to outputs/gpu_check/results as
`gpu_check-cpu_*`). What each check asserts: CHECKS below and docs/gpu.md.

Works from a bare checkout on a GPU machine's own python (torch, transformers, pytest and the project's few
small requirements: docs/gpu.md); it builds its models under outputs/gpu_check (seconds, except the
Qwen2.5-0.5B-shaped one of the speed check, about 2 GB).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "gpu_check"
WORKER = "tests.gpu.checks"
WORK = common.ROOT / "outputs" / "gpu_check"
BUDGET_S = 570  # the whole list, under the 10 minutes the acceptance allows (model builds included)
STATUSES = ("passed", "failed", "skipped")


@dataclass(frozen=True)
class Check:
    """One acceptance check: run by the function of the same name in tests/gpu/checks.py."""

    name: str
    what: str
    """One line for the report: what it runs and what it asserts."""
    timeout_s: int
    needs: tuple[str, ...] = ()
    """Modules that must be importable (found without importing them), else the check is skipped."""
    min_gpus: int = 1


CHECKS = (
    Check("cuda_nccl", "torch.distributed on NCCL, 1 rank: an all_reduce of a CUDA tensor gives the right sum", 60),
    Check(
        "train_hf_bf16",
        "the entrypoint (torchrun, 1 rank), hf engine, bf16 engine and FSDP2 compute on CUDA, 3 steps: exit 0, "
        "finite losses, rollout/logprob_diff below the bf16 limit",
        150,
    ),
    Check(
        "train_vllm_colocated",
        "the same with the in-process vLLM engine colocated: sleep during the update, wake, weight reload each step "
        "(dummy initial weights), CUDA graphs on (rollout.enforce_eager=false): exit 0, sync bytes every step, "
        "rollout/logprob_diff below the bf16 limit",
        200,
        needs=("vllm",),
    ),
    Check(
        "packed_rows_sdpa",
        "forward_log_probs packed (model.use_remove_padding) equals padded on the same ragged rows, sdpa, float32 "
        "and bf16, far below what a leak across samples gives",
        90,
    ),
    Check(
        "packed_rows_flash",
        "the same with attn_implementation=flash_attention_2 (bf16, varlen attention over the packed row)",
        90,
        needs=("flash_attn",),
    ),
    Check(
        "memory_plan",
        "the memory plan's estimate of one actor update against torch.cuda.max_memory_allocated of that update",
        90,
        needs=("torchrl_post.memory_plan",),
    ),
    Check(
        "actor_offload",
        "actor.fsdp.param_offload + optimizer_offload: the GPU memory the actor holds while the engine generates, "
        "with and without the offload, and the update after an onload equal to one that never offloaded",
        90,
    ),
    Check(
        "sequence_parallel",
        "Ulysses sp = 2 on 2 ranks sharing the GPU (gloo, TF32 off): the exchanges exact, a tiny Qwen2 sharded equal "
        "to whole (padded, packed, shared rows, GQA), the actor, critic and reference with sp equal to without, "
        "float32 and bf16",
        90,
    ),
    Check(
        "expert_parallel",
        "expert parallelism ep = 2 on 2 ranks sharing the GPU (gloo, TF32 off): a tiny Qwen3-MoE wrapped by "
        "apply_fsdp with the (efsdp, ep) mesh equal to ep = 1 (gradients, norm, weights, the per-expert sync), float32 "
        "and bf16 with torch._grouped_mm",
        60,
    ),
    Check(
        "split_placement",
        "2 ranks: vLLM engine on GPU 1, FSDP2 actor on GPU 0 (placement.rollout=[1] placement.actor=[0]), the NCCL "
        "weight broadcast, trainer.max_off_policy_steps=1: exit 0, staleness 1 after the first step, sync bytes",
        200,
        needs=("vllm",),
        min_gpus=2,
    ),
    Check(
        "speed_vs_trl",
        "a Qwen2.5-0.5B-shaped model (random weights, Qwen's vocabulary 151936): our steps/s and generated "
        "tokens/s against TRL's GRPOTrainer on the same GPU, batch, lengths and bf16",
        330,
        needs=("trl",),
    ),
    Check(
        "moe_routes_vllm",
        "routing replay on a tiny Qwen3-MoE with the colocated vLLM engine and CUDA graphs: the experts come from "
        "vLLM's own capture (enable_return_routed_experts), every request has them, rollout/router_mismatch < 0.5",
        200,
        needs=("vllm",),
    ),
    Check(
        "partial_rollouts_vllm",
        "partial rollouts with the colocated vLLM engine and CUDA graphs: async scheduling off, the KV cache capped "
        "at what max_num_seqs sequences fill, the prefix cache salted by the weights: exit 0, finite losses, parity",
        200,
        needs=("vllm",),
    ),
)
SKIP_REASONS = {"torchrl_post.memory_plan": "memory plan not available"}


@dataclass
class Record:
    """One check's outcome."""

    name: str
    status: str
    reason: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def importable(module: str) -> bool:
    """Whether `module` can be found (its parents are imported to look, never the module itself)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def skip_reason(check: Check, gpus: int, have: dict[str, bool]) -> str | None:
    """Why `check` is skipped on this machine, or None when it runs."""
    for module in check.needs:
        if not have.get(module, False):
            return SKIP_REASONS.get(module, f"{module} is not installed")
    if gpus < check.min_gpus:
        return f"needs {check.min_gpus} GPUs, {gpus} visible"
    return None


def no_gpu_reason() -> str | None:
    """Why no check can run on this machine (no CUDA device visible), or None when one is visible."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda} build, no device" if torch.version.cuda else "cuda unavailable"
    return f"no CUDA device visible (torch {torch.__version__}, {build})"


def no_gpu_line() -> str | None:
    """The command's one line for a machine without a CUDA device, or None when one is visible."""
    reason = no_gpu_reason()
    return None if reason is None else f"gpu-check: {reason}; nothing to check"


def exit_code(records: list[Record]) -> int:
    return 1 if any(r.status == "failed" for r in records) else 0


def assemble(records: list[Record], device: str, budget_s: float, wall_s: float) -> dict[str, Any]:
    """The report's record: every check (run or not), the counts by status, the wall time against the budget."""
    counts = {s: sum(r.status == s for r in records) for s in STATUSES}
    return {
        "device": device,
        "budget_s": budget_s,
        "wall_s": wall_s,
        "counts": counts,
        "ok": exit_code(records) == 0,
        "checks": [asdict(r) | {"what": _what(r.name)} for r in records],
    }


def _what(name: str) -> str:
    return next((c.what for c in CHECKS if c.name == name), "")


# ---- running a check in its own process ------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The children import this checkout (not an installed copy) and tokenizers stay single-process."""
    path = os.environ.get("PYTHONPATH", "")
    return dict(
        os.environ,
        PYTHONPATH=f"{common.ROOT}{os.pathsep}{path}" if path else str(common.ROOT),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )


def run_child(check: Check, device: str, limit_s: float) -> Record:
    """The worker on `check` in a process session of its own, killed whole (torchrun and its ranks) past
    `limit_s`; its record, or a failed one with the tail of its log."""
    out = WORK / "records" / f"{check.name}.json"
    log = WORK / "logs" / f"{check.name}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", WORKER, check.name, "--out", str(out), "--work", str(WORK), "--device", device]
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd, cwd=common.ROOT, stdout=f, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True
        )
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    seconds = time.perf_counter() - t0
    if rc is None:
        return Record(check.name, "failed", f"timed out after {limit_s:.0f} s (log {_rel(log)})", seconds=seconds)
    if out.exists():
        rec = json.loads(out.read_text())
        return Record(check.name, rec["status"], rec.get("reason", ""), rec.get("numbers", {}), seconds)
    tail = " | ".join(line.strip() for line in log.read_text(errors="replace").splitlines()[-4:])
    return Record(check.name, "failed", f"exit {rc} without a record (log {_rel(log)}): {tail}", seconds=seconds)


def _rel(path: Path) -> str:
    return str(path.relative_to(common.ROOT)) if path.is_relative_to(common.ROOT) else str(path)


class Runner:
    """The checks of one session, in order: each skipped, failed for want of budget, or run in its own process
    under min(its limit, what is left of `budget_s`, counted from this runner's creation); the records kept."""

    def __init__(self, device: str, budget_s: float) -> None:
        import torch

        self.device, self.budget_s = device, budget_s
        self.gpus = torch.cuda.device_count() if device == "cuda" else 2  # CPU plumbing: gloo runs any number
        self.have: dict[str, bool] = {}
        self.records: list[Record] = []
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def run(self, check: Check) -> Record:
        left = self.budget_s - self.elapsed()
        have = {m: self.have.setdefault(m, importable(m)) for m in check.needs}
        reason = skip_reason(check, self.gpus, have)
        if reason is not None:
            rec = Record(check.name, "skipped", reason)
        elif left < 10:
            rec = Record(check.name, "failed", f"not run: {self.budget_s:.0f} s budget spent by the checks before it")
        else:
            rec = run_child(check, self.device, min(check.timeout_s, left))
        self.records.append(rec)
        return rec


def run_checks(checks: list[Check], device: str, budget_s: float) -> list[Record]:
    """`checks` one after another through one Runner (what the session's tests do, one test each)."""
    runner = Runner(device, budget_s)
    return [runner.run(check) for check in checks]


# ---- the report ------------------------------------------------------------------------------------------------

MARK = {"passed": "PASS", "failed": "FAIL", "skipped": "skip"}


def _numbers(numbers: dict[str, Any], limit: int = 6) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}"
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v[:4]) + (", ..." if len(v) > 4 else "") + "]"
        return str(v)

    def flat(v: Any) -> bool:
        return not isinstance(v, dict) and not (isinstance(v, list) and any(isinstance(x, dict) for x in v))

    items = [(k, v) for k, v in numbers.items() if flat(v) and v is not None][:limit]
    return "; ".join(f"{k} {fmt(v)}" for k, v in items)


def markdown(rec: dict[str, Any]) -> str:
    c = rec["counts"]
    lines = [
        "# GPU check: the acceptance list on one machine",
        "",
        f"Device {rec['device']}; {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped in "
        f"{rec['wall_s']:.0f} s (budget {rec['budget_s']:.0f} s): **{'OK' if rec['ok'] else 'FAILED'}**. Skipped: "
        "the package is missing or too few GPUs are visible, never a failure. Each check ran in a process of its "
        "own (tests/gpu/checks.py); its log is under outputs/gpu_check/logs.",
        "",
        *([rec["note"], ""] if rec.get("note") else []),
        "| check | status | s | reason | numbers |",
        "|---|---|---|---|---|",
    ]
    for r in rec["checks"]:
        reason = r["reason"].replace("|", "/")
        lines.append(
            f"| {r['name']} | {MARK[r['status']]} | {r['seconds']:.0f} | {reason} | {_numbers(r['numbers'])} |"
        )
    lines += ["", "What each check runs and asserts:", ""]
    lines += [f"- `{r['name']}`: {r['what']}" for r in rec["checks"]]
    speed = next((r for r in rec["checks"] if r["name"] == "speed_vs_trl" and r["numbers"].get("runs")), None)
    if speed:
        n = speed["numbers"]
        lines += [
            "",
            f"## Speed: {n['model']}, {n['prompts']} prompts x {n['n']} samples, {n['response_length']} new "
            f"tokens, {n['dtype']}",
            "",
            f"Tokenizer: {n['tokenizer']}; data: {n['data']}. Median over the steps after the first. Generated "
            "tokens/s = samples x mean response length / step seconds (the same count on both sides).",
            "",
            common.table(
                n["runs"],
                [
                    ("run", "label", "{}"),
                    ("step s", "step_s", "{:.2f}"),
                    ("steps/s", "steps_per_s", "{:.3f}"),
                    ("generated tok/s", "tokens_per_s", "{:.0f}"),
                    ("mean response", "response_length_mean", "{:.1f}"),
                    ("vs TRL", "vs_trl", "{:.2f}x"),
                ],
            ),
        ]
    return "\n".join(lines) + "\n"


def plot(path: Path, rec: dict[str, Any]) -> None:
    plt = common.pyplot()
    checks = rec["checks"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(checks) + 1.2))
    colors = {"passed": "C2", "failed": "C3", "skipped": "0.7"}
    names = [r["name"] for r in checks][::-1]
    secs = [r["seconds"] for r in checks][::-1]
    ax.barh(names, secs, color=[colors[r["status"]] for r in checks][::-1])
    for y, r in enumerate(checks[::-1]):
        ax.annotate(f" {MARK[r['status']]}", (r["seconds"], y), va="center", fontsize=8)
    ax.set(xlabel="seconds", title=f"gpu-check on {rec['device']}: {rec['wall_s']:.0f} s of {rec['budget_s']:.0f}")
    common.save_figure(fig, path)


# ---- the session's report --------------------------------------------------------------------------------------


def where(device: str, info: dict[str, Any]) -> str:
    """The device the report names (`info`: common.machine()): the GPUs, or the CPU in plumbing mode."""
    return info["gpu"] if device == "cuda" else f"CPU ({info['cpu']}, plumbing only)"


def results_dir(device: str, results: Path | None = None) -> Path:
    return results or (common.RESULTS if device == "cuda" else WORK / "results")


def write(runner: Runner, results: Path | None = None) -> Path:
    """The report of the runner's records: `<results>/gpu_check_<machine>_<date>.{json,md,png}` (CPU plumbing:
    `gpu_check-cpu_*`, by default under outputs/gpu_check/results); the JSON's path."""
    info = common.machine()  # imports vLLM when it is there: once
    rec = assemble(runner.records, where(runner.device, info), runner.budget_s, runner.elapsed()) | {"machine": info}
    name = NAME if runner.device == "cuda" else f"{NAME}-cpu"
    return common.write_report(results_dir(runner.device, results), name, rec, markdown, plot)


def summary(path: Path) -> str:
    """The command's last line: the counts, the wall time and the report."""
    rec = json.loads(path.read_text())
    c = rec["counts"]
    return (
        f"gpu-check on {rec['device']}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped in "
        f"{rec['wall_s']:.0f} s (budget {rec['budget_s']:.0f} s); {path.with_suffix('.md')}"
    )
