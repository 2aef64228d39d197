"""What every benchmark shares: the machine, where results go and how they are named, torchrun, timing, plots.

A module `benchmarks/<name>.py` exposes `NAME`, `run(args) -> dict` (args.quick, args.tiny and its own `OPTIONS`),
`markdown(rec) -> str` and `plot(path, rec)`; `write_report` writes `<results>/<name>_<machine>_<date>.{json,md,png}`.
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
from collections.abc import Callable, Iterable, Sequence
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
Record = dict[str, Any]


def proc_field(path: str, key: str) -> str | None:
    """The value after `key` in a /proc file (`/proc/meminfo`, `MemAvailable:`); None when absent or unreadable."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine() -> Record:
    """What a result was measured on: CPU model and cores, GPU (if any), library versions."""
    import torch

    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = "not installed"
    gpu = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else None
    return {
        "cpu": proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "gpu": gpu, "torch": torch.__version__, "vllm": vllm_version,
        "python": platform.python_version(), "platform": platform.platform(),
    }  # fmt: skip


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_tag(info: Record | None = None) -> str:
    """A short file-name-safe name of the machine: `amd-epyc-2c`, `intel-xeon-platinum-8480-16c-1x-nvidia-h100`."""
    info = info or machine()
    cpu = re.sub(r"\((r|tm)\)|@.*|\b(\d+-core|processor|cpu)\b", " ", info["cpu"], flags=re.I)
    tag = f"{_slug(cpu)}-{info['cpu_count']}c"
    if info.get("gpu"):
        gpu = re.sub(r"\b(\d+\s*gb|hbm\w*|pcie|sxm\d*|nvl)\b", " ", info["gpu"], flags=re.I)
        tag += "-" + _slug(gpu)
    return tag


def result_stem(name: str, info: Record | None = None, date: str | None = None) -> str:
    return f"{name}_{machine_tag(info)}_{date or datetime.date.today().isoformat()}"


Markdown = Callable[[Record], str]
Plot = Callable[[Path, Record], None]


def write_report(results: Path, name: str, rec: Record, markdown: Markdown, plot: Plot) -> Path:
    """<results>/<name>_<machine>_<date>.{json,md,png}, `benchmark`, `machine` and `date` added; the JSON's path."""
    date = rec.get("date") or datetime.date.today().isoformat()
    rec = {"benchmark": name, "machine": rec.get("machine") or machine(), "date": date, **rec}
    json_path = (results / result_stem(name, rec["machine"], rec["date"])).with_suffix(".json")
    write_json(json_path, rec)
    render(json_path, markdown, plot)
    return json_path


def render(json_path: Path, markdown: Markdown, plot: Plot) -> None:
    """The .md and .png beside a record's JSON, from the JSON alone (what `--report-only` runs)."""
    rec = json.loads(json_path.read_text())
    m = rec["machine"]
    gpu = f", {m['gpu']}" if m.get("gpu") else ", no GPU"
    header = (
        f"<!-- {rec['benchmark']}: {m['cpu']} ({m['cpu_count']} cores){gpu}; torch {m['torch']}, "
        f"vllm {m['vllm']}; {rec['date']} -->\n"
    )
    json_path.with_suffix(".md").write_text(header + markdown(rec))
    plot(json_path.with_suffix(".png"), rec)


def versions(rec: Record, loads: list[float] | None = None) -> str:
    """`2 CPUs, torch X, vllm Y`: the line most reports open with; with the 1-minute load averages of the runs."""
    m = rec["machine"]
    text = f"{m['cpu_count']} CPUs, torch {m['torch']}, vllm {m['vllm']}"
    if not loads:
        return text
    span = f"{min(loads):.1f}" + (f" to {max(loads):.1f}" if max(loads) > min(loads) else "")
    return f"{text}; 1-minute load average {span} (the CPUs were shared: timings are noisy)"


def torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def run_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float | None = None) -> None:
    """Run `cmd` from the repository root with its output in `log`; a failure is one error with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False, env=env, timeout=timeout)
    check_logged(cmd, proc.returncode, log)


def check_logged(cmd: list[str], returncode: int, log: Path) -> None:
    if returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed (exit {returncode}); log {log}:\n{tail}")


def warn_if_busy() -> None:
    load, cpus = load_1m(), os.cpu_count() or 1
    if load > cpus:
        print(f"    warning: load average {load:.1f} on {cpus} CPUs; other processes share the timings", flush=True)


def table(rows: list[Record], columns: list[tuple[str, str, str]]) -> str:
    """A markdown table: `columns` are (header, key, format); a missing key is an empty cell."""
    head = "| " + " | ".join(c[0] for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = [
        "| " + " | ".join(fmt.format(r[k]) if r.get(k) is not None else "" for _, k, fmt in columns) + " |"
        for r in rows
    ]
    return "\n".join([head, rule, *body]) + "\n"


def blocks(*parts: str) -> str:
    """Markdown blocks (headings, paragraphs, tables) one blank line apart, empty ones left out."""
    return "\n\n".join(p.strip("\n") for p in parts if p) + "\n"


def na(x: float | None, spec: str = "{:.2f}") -> str:
    return "n/a" if x is None else spec.format(x)


def load_1m() -> float:
    return os.getloadavg()[0]


Options = dict[str, dict[str, Any]]  # a module's own `OPTIONS`: flag -> add_argument's keywords


def parser(description: str | None, own: Options | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(description or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the ~5-minute subset")
    ap.add_argument("--tiny", action="store_true", help="the smallest sizes that exercise every path (tests)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    for flag, kw in (own or {}).items():
        ap.add_argument(flag, **kw)
    return ap


def options(args: argparse.Namespace, own: Options) -> argparse.Namespace:
    """A module's own options (their defaults) overlaid with the runner's `args` (quick, tiny, results): its `run`'s."""
    return argparse.Namespace(**{**vars(parser(None, own).parse_args([])), **vars(args)})


def mode(args: argparse.Namespace) -> str:
    """`tiny`, `quick` or `full`: the key of a module's settings."""
    return "tiny" if args.tiny else "quick" if args.quick else "full"


def mem_available() -> int:
    """Bytes the kernel says can be allocated without swapping (MemAvailable); a large number when unknown."""
    kb = proc_field("/proc/meminfo", "MemAvailable:")
    return int(kb.split()[0]) * 1024 if kb else 1 << 50


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
    """A random Qwen2 (vocabulary 128, the demo's tokenizer); head_dim = hidden_size / num_heads is 32 or 64."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


SIZES = {s.name: s for s in (
    ModelSize("qwen2-1m", 128, 5, 4, 2, 384), ModelSize("qwen2-10m", 256, 10, 4, 2, 1024),
    ModelSize("qwen2-40m", 512, 13, 8, 4, 1536), ModelSize("qwen2-100m", 768, 13, 12, 4, 2560),
)}  # fmt: skip
TINY = ModelSize("qwen2-tiny", 64, 2, 2, 1, 128)  # the --tiny model of update and sft


def built(out: Path) -> bool:
    return (out / "config.json").is_file() and any(out.glob("*.safetensors"))


def model_dir(size: ModelSize, **extra: Any) -> Path:
    out = MODELS / size.name
    if not built(out):
        from torchrl_post.demo.build import build_tiny_model

        build_tiny_model(out, seed=0, **{k: v for k, v in asdict(size).items() if k != "name"}, **extra)
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
) -> tuple[list[Record], float]:
    """`torchrun -m torchrl_post.train` (run directory LOGS/runs/<tag>): its metrics.jsonl rows and wall seconds."""
    run_dir = LOGS / "runs" / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        *torchrun(), "--standalone", "--nproc-per-node", str(nproc), "-m", "torchrl_post.train",
        "trainer.save_freq=0", f"trainer.default_local_dir={run_dir}", f"trainer.experiment_name=bench_{tag}",
        *overrides,
    ]  # fmt: skip
    warn_if_busy()
    t0 = time.perf_counter()
    run_logged(cmd, LOGS / f"{tag}.log", env=child_env({"TOKENIZERS_PARALLELISM": "false", **(env or {})}))
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, wall


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with `env` added, the repository first on PYTHONPATH (workers import it)."""
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH", "")) if p)
    return full


def median(rows: list[Record], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def medians(rows: list[Record], metrics: dict[str, str], first_step: int = 0) -> Record:
    """`{key: median of metric}` over the rows from training step `first_step` on (all rows when none is)."""
    kept = [r for r in rows if r.get("training/global_step", 0) >= first_step] or rows
    return {key: median(kept, metric) for key, metric in metrics.items()}


def run_worker(
    tag: str, worker: str | Path, nproc: int, options: Record, env: dict[str, str] | None = None, python: Any = None,
    wall_key: str = "",
) -> Any:  # fmt: skip
    """`-m <worker> --worker` under torchrun on `nproc` processes, or the script `worker` by `python` (TRL's venv),
    with `--<name> <value>` per option and `--out LOGS/<tag>.json`: what it wrote, with the load average (and the
    launch's wall seconds as `wall_key`, if given)."""
    out = LOGS / f"{tag}.json"
    out.unlink(missing_ok=True)
    warn_if_busy()
    if python:
        launch = [str(python), str(worker)]
    else:
        launch = [*torchrun(), "--standalone", "--nproc-per-node", str(nproc), "-m", str(worker), "--worker"]
    full_env = dict(os.environ, **(env or {})) if python else child_env(env)
    flags = [x for k, v in (options | {"out": out}).items() for x in ("--" + k.replace("_", "-"), str(v))]
    t0 = time.perf_counter()
    run_logged([*launch, *flags], LOGS / f"{tag}.log", env=full_env)
    rec = json.loads(out.read_text())
    rec["loadavg_1m"] = load_1m()
    if wall_key:
        rec[wall_key] = time.perf_counter() - t0
    return rec


def worker_args(doc: str | None, argv: list[str] | None = None, **options: Any) -> argparse.Namespace:
    """A worker's options: `--out` and `--<name>` per keyword, of its default's type (a type: required; a bool: a
    switch; a tuple: the choices, the first the default)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    for name, default in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, type):
            ap.add_argument(flag, type=default, required=True)
        elif isinstance(default, bool):
            ap.add_argument(flag, action="store_true")
        elif isinstance(default, tuple):
            ap.add_argument(flag, choices=default, default=default[0])
        else:
            ap.add_argument(flag, type=type(default), default=default)
    return ap.parse_args(argv)


def worker_init(device: str, model: Path | str | None = None) -> tuple[Any, Any]:
    """A worker's start under torchrun: (its `DistEnv`, the world's group up; a default `Config`, `model` its path)."""
    from torchrl_post.config.schema import Config
    from torchrl_post.distributed.env import init_world, read_env

    env, cfg = read_env(device), Config()
    init_world(env)
    if model is not None:
        cfg.model.path = str(Path(model).resolve())
    return env, cfg


def all_gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def write_json(path: Path, rec: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")


def take_turns(
    calls: dict[str, Callable[[], Any]], repeats: int, sync: Callable[[], Any] = lambda: None
) -> dict[str, list[tuple[float, float, Any]]]:
    """(wall s, process CPU s, result) per call and round: a warm-up each, then `repeats` rounds in turn."""
    for call in calls.values():
        sync()
        call()
    out: dict[str, list[tuple[float, float, Any]]] = {k: [] for k in calls}
    for _ in range(repeats):
        for key, call in calls.items():
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            result = call()
            sync()
            out[key].append((time.perf_counter() - t0, time.process_time() - c0, result))
    return out


def build_actor(cfg: Any, mesh: Any, device: Any, samples: int = 1, response: int = 8, **kw: Any) -> Any:
    """The project's `Actor` for one update of `samples` rows of at most `response` tokens."""
    from torchrl_post.workers.actor import Actor

    return Actor(
        cfg.model, cfg.actor, mesh, device, temperature=kw.pop("temperature", 1.0), mini_batch_samples=samples,
        micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu, max_response_length=response, total_steps=1, **kw,
    )  # fmt: skip


def build_engine(cfg: Any, device: Any, seed: int = 0, stop: bool = True, tok: Any = None) -> Any:
    """The engine `cfg.rollout.engine` names, as the trainer builds it (`stop`: the tokenizer's EOS stops)."""
    from transformers import AutoTokenizer

    from torchrl_post.engines.build import build_engine as build
    from torchrl_post.plan import engine_spec

    tok = tok or AutoTokenizer.from_pretrained(cfg.model.path)
    spec = engine_spec(cfg, device=device.type)
    return build(cfg.model, cfg.rollout, spec, device, seed, tok.pad_token_id, [tok.eos_token_id] if stop else [])


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(*args: Any, **kw: Any) -> tuple[Any, Any]:
    return pyplot().subplots(*args, **kw)


def save_figure(fig: Any, path: Path, title: str = "") -> None:
    """Title (if any), lay out, write the PNG, free the figure."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def bars(
    ax: Any, ticks: list[str], series: list[tuple[str, list[Any]]], fmt: str = "", ylabel: str = "", title: str = ""
) -> None:
    """Grouped bars: a group per tick, a bar per (label, values) series (None: no bar), labelled with `fmt`."""
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        pts = [(k + (i - (len(series) - 1) / 2) * width, y) for k, y in enumerate(values) if y is not None]
        drawn = ax.bar([x for x, _ in pts], [y for _, y in pts], width, label=label, color=f"C{i}")
        if fmt:
            ax.bar_label(drawn, [fmt.format(y) for _, y in pts], fontsize=8)
    ax.set_xticks(range(len(ticks)), ticks)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=8)


Curve = tuple[str, Sequence[Any], Sequence[Any], str]  # (label, xs, ys, matplotlib format such as "C1o-" or "k--")


def lines(
    ax: Any, curves: Iterable[Curve], title: str = "", ticks: Sequence[Any] = (), tick_labels: Sequence[str] = (),
    **axes: Any,
) -> None:  # fmt: skip
    """A line per curve (a dashed one without markers, a reference or a fit, faint); `axes`: Axes.set's keywords
    (scales, labels); `ticks`: exactly these x ticks (labelled `tick_labels`, else the values); title, legend."""
    for label, xs, ys, fmt in curves:
        ax.plot(xs, ys, fmt, label=label, alpha=0.6 if fmt.lstrip("kC0123456789") == "--" else None)
    ax.set(**axes)
    if ticks:
        ax.set_xticks(ticks, tick_labels or [str(t) for t in ticks])
        ax.minorticks_off()
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def standalone(module: Any = None, argv: list[str] | None = None) -> None:
    """`python -m benchmarks.<name>` (`module`: the `__main__` one): its run and report (`--worker` first: `worker`)."""
    module = module or sys.modules["__main__"]
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        module.worker(argv[1:])
        return
    args = parser(module.__doc__, getattr(module, "OPTIONS", None)).parse_args(argv)
    start = time.perf_counter()
    path = write_report(args.results, module.NAME, module.run(args), module.markdown, module.plot)
    print(f"done in {time.perf_counter() - start:.0f} s; {path}", flush=True)
