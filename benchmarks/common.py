"""What every benchmark shares: the machine it ran on, where results go and how they are named, torchrun.

A benchmark module `benchmarks/<name>.py` exposes
    NAME: str                                    the result's name ("rollout", "update", ...)
    run(args: argparse.Namespace) -> dict        measure (args.quick: the 5-minute subset; args.tiny: the
                                                 smallest sizes that still exercise every path, for tests)
    markdown(rec: dict) -> str                   the table (and a line on what it means) from the record
    plot(path: Path, rec: dict) -> None          the PNG from the record
and `python -m benchmarks` (benchmarks/__main__.py) runs them, then `write_report` writes
`<results>/<name>_<machine>_<date>.{json,md,png}`. `--report-only` rebuilds .md and .png from every JSON.

Records are plain JSON: lists of rows (dicts), the measurement settings, and `machine` / `date`
added here. Ratios against a reference measured in the same run are the headline numbers: absolute
times on a shared 2-core machine are noise, ratios taken minutes apart on the same machine much less so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ROOT / "outputs" / "bench_models"
DATA = ROOT / "outputs" / "bench_data"
LOGS = ROOT / "outputs" / "bench_logs"
DEMO_MODEL = ROOT / "outputs" / "demo_model"  # `make demo`'s model and data, as the trainer's defaults find them
DEMO_DATA = ROOT / "outputs" / "demo_data"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name() -> str | None:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    return None


def device_kind() -> str:
    """What the trainer runs on here: cuda or cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def machine() -> dict[str, Any]:
    """What a result was measured on: CPU model and cores, GPU (if any), library versions."""
    import torch

    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = "not installed"
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "vllm": vllm_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_tag(info: dict[str, Any] | None = None) -> str:
    """A short file-name-safe name of the machine: `amd-epyc-2c`, `intel-xeon-platinum-8480-16c-1x-nvidia-h100`
    (trademarks, clock, "CPU", "Processor", core counts in the name, GPU memory and form factor left out)."""
    info = info or machine()
    cpu = re.sub(r"\((r|tm)\)|@.*|\b(\d+-core|processor|cpu)\b", " ", info["cpu"], flags=re.I)
    tag = f"{_slug(cpu)}-{info['cpu_count']}c"
    if info.get("gpu"):
        gpu = re.sub(r"\b(\d+\s*gb|hbm\w*|pcie|sxm\d*|nvl)\b", " ", info["gpu"], flags=re.I)
        tag += "-" + _slug(gpu)
    return tag


def today() -> str:
    return datetime.date.today().isoformat()


def result_stem(name: str, info: dict[str, Any] | None = None, date: str | None = None) -> str:
    return f"{name}_{machine_tag(info)}_{date or today()}"


def write_report(
    results: Path,
    name: str,
    rec: dict[str, Any],
    markdown: Callable[[dict[str, Any]], str],
    plot: Callable[[Path, dict[str, Any]], None],
) -> Path:
    """<results>/<name>_<machine>_<date>.json (the record, with `benchmark`, `machine` and `date` added),
    .md (`markdown(rec)`) and .png (`plot(path, rec)`); returns the JSON's path."""
    results.mkdir(parents=True, exist_ok=True)
    rec = {"benchmark": name, "machine": rec.get("machine") or machine(), "date": rec.get("date") or today(), **rec}
    stem = results / result_stem(name, rec["machine"], rec["date"])
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(rec, indent=1) + "\n")
    render(json_path, markdown, plot)
    return json_path


def render(
    json_path: Path, markdown: Callable[[dict[str, Any]], str], plot: Callable[[Path, dict[str, Any]], None]
) -> None:
    """The .md and .png beside a record's JSON, from the JSON alone (what `--report-only` runs)."""
    rec = json.loads(json_path.read_text())
    json_path.with_suffix(".md").write_text(header(rec) + markdown(rec))
    plot(json_path.with_suffix(".png"), rec)


def header(rec: dict[str, Any]) -> str:
    m = rec["machine"]
    gpu = f", {m['gpu']}" if m.get("gpu") else ", no GPU"
    return (
        f"<!-- {rec['benchmark']}: {m['cpu']} ({m['cpu_count']} cores){gpu}; torch {m['torch']}, "
        f"vllm {m['vllm']}; {rec['date']} -->\n"
    )


def torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def run_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float | None = None) -> None:
    """Run `cmd` from the repository root with its output in `log`; a failure is one error with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed (exit {proc.returncode}); log {log}:\n{tail}")


def warn_if_busy() -> None:
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > cpus:
        print(f"    warning: load average {load:.1f} on {cpus} CPUs; other processes share the timings", flush=True)


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A markdown table: `columns` are (header, key, format); a missing key is an empty cell."""
    head = "| " + " | ".join(c[0] for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = [
        "| " + " | ".join(fmt.format(r[k]) if r.get(k) is not None else "" for _, k, fmt in columns) + " |"
        for r in rows
    ]
    return "\n".join([head, rule, *body]) + "\n"


def load_1m() -> float:
    """The 1-minute load average: above the benchmark's own processes, something else shared the CPUs."""
    return os.getloadavg()[0]


def parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes (a module with more adds them to this and defines `parse_args`)."""
    ap = argparse.ArgumentParser(description=description.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the ~5-minute subset")
    ap.add_argument("--tiny", action="store_true", help="the smallest sizes that exercise every path (tests)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    return ap


def options(args: argparse.Namespace, parse: Callable[[list[str]], argparse.Namespace]) -> argparse.Namespace:
    """A module's own options (its parser's defaults) overlaid with the runner's `args` (quick, tiny, results)."""
    return argparse.Namespace(**{**vars(parse([])), **vars(args)})


def mode(args: argparse.Namespace) -> str:
    """`tiny`, `quick` or `full`: the key of a module's settings."""
    return "tiny" if args.tiny else "quick" if args.quick else "full"


def mem_available() -> int:
    """Bytes the kernel says can be allocated without swapping (MemAvailable); a large number when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 50


def fit(points: list[tuple[int, int]]) -> dict[str, float] | None:
    """Least-squares line y = intercept + slope * x through (x, y) points (None below 2): bytes per token."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return {"slope_bytes_per_token": slope, "intercept_bytes": my - slope * mx, "points": n}


@dataclass(frozen=True)
class ModelSize:
    """A random Qwen2 (vocabulary 128, the demo's character tokenizer); head_dim = hidden_size / num_heads is 32
    or 64 (build_tiny_model's constraint)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


SIZES = {
    s.name: s
    for s in (
        ModelSize("qwen2-1m", 128, 5, 4, 2, 384),
        ModelSize("qwen2-10m", 256, 10, 4, 2, 1024),
        ModelSize("qwen2-40m", 512, 13, 8, 4, 1536),
        ModelSize("qwen2-100m", 768, 13, 12, 4, 2560),
    )
}


def model_dir(size: ModelSize) -> Path:
    """The model's directory under MODELS, built once (build_tiny_model is seeded: a cached one is the same)."""
    out = MODELS / size.name
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    from torchrl_post.demo.build import build_tiny_model

    spec = {k: v for k, v in asdict(size).items() if k != "name"}
    build_tiny_model(out, seed=0, **spec)
    return out


def demo_model() -> Path:
    """The demo model (and its data beside it), built once when missing."""
    if not (DEMO_MODEL / "demo_build.json").is_file():
        from torchrl_post.demo.build import build_demo

        print("building the demo model (once) ...", flush=True)
        build_demo(DEMO_MODEL, DEMO_DATA)
    return DEMO_MODEL


def train_run(
    tag: str, overrides: list[str], nproc: int = 1, env: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], float]:
    """The trainer itself: `torchrun --nproc-per-node nproc -m torchrl_post.train` with `overrides` (key=value,
    `--config-name NAME` too), its run directory LOGS/runs/<tag> (emptied first), its log LOGS/<tag>.log and
    `env` added to this process's environment. Returns the rows of its metrics.jsonl and the run's wall seconds."""
    run_dir = LOGS / "runs" / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    full_env = dict(os.environ, TOKENIZERS_PARALLELISM="false", **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full_env.get("PYTHONPATH", "")) if p)
    cmd = [
        *torchrun(), "--standalone", "--nproc-per-node", str(nproc), "-m", "torchrl_post.train",
        "trainer.save_freq=0", f"trainer.default_local_dir={run_dir}", f"trainer.experiment_name=bench_{tag}",
        *overrides,
    ]  # fmt: skip
    warn_if_busy()
    t0 = time.perf_counter()
    run_logged(cmd, LOGS / f"{tag}.log", env=full_env)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, wall


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    """The median of a metric over the rows that have it (None when none has)."""
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def run_worker(tag: str, worker: Path, nproc: int, worker_args: list[str], env: dict[str, str] | None = None) -> Any:
    """`worker` under torchrun on `nproc` processes with `--out LOGS/<tag>.json` added (its log beside it); the
    record it wrote, with the 1-minute load average at the end (above the run's own ranks: shared CPUs)."""
    out = LOGS / f"{tag}.json"
    out.unlink(missing_ok=True)
    cmd = [*torchrun(), "--standalone", "--nproc-per-node", str(nproc), str(worker), *worker_args, "--out", str(out)]
    run_logged(cmd, LOGS / f"{tag}.log", env=env)
    rec = json.loads(out.read_text())
    rec["loadavg_1m"] = load_1m()
    return rec


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display on benchmark machines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write the PNG, free the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def standalone(module: Any, argv: list[str] | None = None) -> None:
    """`python -m benchmarks.<name>`: the module's options (`parse_args`, else `parser`'s), its run, its report."""
    args = module.parse_args(argv) if hasattr(module, "parse_args") else parser(module.__doc__).parse_args(argv)
    start = time.perf_counter()
    path = write_report(args.results, module.NAME, module.run(args), module.markdown, module.plot)
    print(f"done in {time.perf_counter() - start:.0f} s; {path}", flush=True)
