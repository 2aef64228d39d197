"""Record the demo's metrics.jsonl for 20 steps (2 processes, default config) as the behaviour fixture.

    .venv/bin/python -m tests.e2e.golden.record            # writes tests/e2e/golden/demo_20_steps.jsonl

`tests/e2e/test_demo_golden.py` runs the same command with the code under test and compares every key
present in both files (timings and throughput excepted) to 1e-6. The fixture was re-recorded when packing with
shared prompts became the default (issue 22; before: the code of the commit before the step redesign, issue 9),
and when the packed forward began to attend block by block and share each prompt with all its samples (issue 35:
the previous code and the new agreed within 5e-6 on every compared key over the 20 steps, the same samples drawn);
the file beside it says on which machine: floating-point
results depend on the CPU's kernels and thread count, so the test compares every key only on the same kind of
machine, and on any machine the keys no floating-point kernel reaches (`PORTABLE`) and the set of keys.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from torchrl_post.logging.metric_names import CLOCKED

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FIXTURE = HERE / "demo_20_steps.jsonl"
FINGERPRINT = HERE / "demo_20_steps.machine.json"
STEPS = 20
SKIP_PREFIXES = CLOCKED
PORTABLE = (
    "training/", "prompt_length/", "actor/lr", "actor/optimizer_steps", "actor/nonfinite_skips", "reward/errors",
    "perf/sync_bytes", "rollout/staleness",
)  # fmt: skip
"""Keys no floating-point kernel reaches (the data order, the schedule, the counts, the bytes synced): equal on any
machine."""


def machine() -> dict[str, object]:
    """What the floating-point results depend on besides the code."""
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "torch": torch.__version__}


def run_demo(root: Path, built: tuple[Path, Path] | None = None, *extra: str) -> Path:
    """Train the demo for STEPS steps on 2 processes under `root` (the demo `built` as (model, data), else built
    there), with `extra` overrides; returns metrics.jsonl."""
    from torchrl_post.demo.build import build_demo

    model, data = built or (root / "model", root / "data")
    build_demo(model, data)
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "torchrl_post.train",
        f"model.path={model}",
        f"data.train_files={data / 'train.jsonl'}",
        f"data.val_files={data / 'val.jsonl'}",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.default_local_dir={run}",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"demo run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return run / "metrics.jsonl"


def rows_by_step(path: Path) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.setdefault(int(row["training/global_step"]), {}).update(row)
    return out


def compared_keys(a: dict[str, float], b: dict[str, float]) -> list[str]:
    return sorted(k for k in set(a) & set(b) if not k.startswith(SKIP_PREFIXES))


def portable_keys(a: dict[str, float]) -> list[str]:
    return sorted(k for k in a if k.startswith(PORTABLE))


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # the demo as `make demo` builds (and caches) it
        metrics = run_demo(Path(tmp), (REPO / "outputs" / "demo_model", REPO / "outputs" / "demo_data"))
        shutil.copy(metrics, FIXTURE)
    FINGERPRINT.write_text(json.dumps(machine(), indent=1) + "\n")
    print(f"wrote {FIXTURE} ({len(rows_by_step(FIXTURE))} rows) and {FINGERPRINT}")


if __name__ == "__main__":
    main()
