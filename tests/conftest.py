"""Shared helpers: tiny models and data on disk, and running commands under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import prebuild
from tests.launcher import Zygote

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TIERS = ("unit", "distributed", "e2e", "gpu")
_tier_seconds: dict[str, float] = {}
_launches: list[float] = []  # seconds of each torchrun launch this session
_prebuild_wanted: list[str] = []  # the background-built models the collected tests read (tests/prebuild.py)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
"""A one-process launch's environment where its work is small: torchrun leaves such a process the machine's threads,
and beside the suite's background model builds (tests/prebuild.py) two threads wait on each other for seconds."""
_zygote: list[Zygote] = []  # the launcher that forks ranks after the imports (tests/launcher.py), once started


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The unit tests that read the background-built demo models (`tests/prebuild.py`) go after the distributed
    tier, in their order, so the builds have the unit tier's other tests and the distributed tier to finish in (at
    the end of the unit tier they still waited 41 s for them); the tests that read the math agent's model (built
    last, at low priority) go last."""
    if any(not i.nodeid.startswith(("tests/unit/", "tests/gpu/")) for i in items):
        _launcher()  # its imports overlap the tests before the first launch
    reads = [set(prebuild.FIXTURES) & set(getattr(i, "fixturenames", ())) for i in items]
    _prebuild_wanted[:] = [name for name in prebuild.FIXTURES if any(name in r for r in reads)]

    def block(n: int) -> int:  # 0: unit, 1: distributed, 2: unit reading the demo models, 3: the rest, 4: math agent
        node = items[n].nodeid
        if node.startswith("tests/unit/"):
            return 2 if reads[n] else 0
        return 1 if node.startswith("tests/distributed/") else 4 if prebuild.MATH_AGENT in reads[n] else 3

    order = sorted(range(len(items)), key=lambda n: (block(n), n))
    items[:] = [items[n] for n in order]


@pytest.fixture(scope="session", autouse=True)
def _prebuild_models(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Start the background builds of the models the session's tests read (`tests/prebuild.py`); the demo judge,
    reward model and distillation pair need the demo model, which the process builds first (the `demo` fixture
    waits for it: no test before the distributed tier reads it)."""
    demo = demo_dirs(tmp_path_factory) if set(_prebuild_wanted) & set(prebuild.DEMO_FIXTURES) else None
    prebuild.start(_prebuild_wanted, demo, math_agent_dir(tmp_path_factory))


def demo_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Where the session's demo model and data go (the `demo` fixture): (model dir, data dir)."""
    root = tmp_path_factory.getbasetemp() / "demo"
    return root / "model", root / "data"


def math_agent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's math agent model and data go (the `math_agent` fixture, tests/e2e/test_agent.py)."""
    return tmp_path_factory.getbasetemp() / "math_agent"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    prebuild.stop()  # no build outlives the session
    for z in _zygote:
        z.close()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's set-up, call and tear-down seconds, summed by tier (its directory under tests/)."""
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _tier_seconds[tier] = _tier_seconds.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The suite's phases with their seconds: setup (from `make test`, TORCHRL_POST_PHASES="setup=12"), the lint
    `make test` runs beside pytest (its status file, TORCHRL_POST_LINT_STATUS), pytest's tiers, and the torchrun
    launches (docs/tests.md keeps the table)."""
    phases = [p.split("=") for p in os.environ.get("TORCHRL_POST_PHASES", "").split()]
    rows = [(name, float(secs)) for name, secs in phases]
    lint = Path(os.environ.get("TORCHRL_POST_LINT_STATUS", "/nonexistent"))
    status = lint.read_text().split() if lint.is_file() else []  # "<exit code> <seconds>" once the lint is done
    if len(status) == 2:  # `make test` runs the lint beside pytest; it ends long before the whole suite
        rows.append(("lint*", float(status[1])))
    rows += [(t, _tier_seconds[t]) for t in (*TIERS, "other") if t in _tier_seconds]
    if not rows:
        return
    terminalreporter.write_sep("=", "suite phases (seconds)")
    for name, secs in rows:
        terminalreporter.write_line(f"{name:<12} {secs:8.0f}")
    terminalreporter.write_line(f"{'total':<12} {sum(s for _, s in rows):8.0f}")
    if _launches:
        each = sum(_launches) / len(_launches)
        terminalreporter.write_line(f"torchrun launches: {len(_launches)}, {sum(_launches):.0f} s, {each:.1f} s each")
    if len(status) == 2:
        terminalreporter.write_line("* beside pytest (its seconds overlap the unit tier's)")


def _env(env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", **(env or {})}


def run_cmd(args: list[str], timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`args` from the repository root, output captured; this python's `-m module ...` or `script.py ...` forked
    from the suite's launcher after its imports (`tests/launcher.py`), as one plain process."""
    if args[0] in (sys.executable, str(BIN / "python")) and (args[1:2] == ["-m"] or args[1].endswith(".py")):
        return _launcher().launch(0, args[1:], timeout, _env(env))
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=_env(env))


def _launcher() -> Zygote:
    if not _zygote:
        import tempfile

        _zygote.append(Zygote(_env(None), REPO, Path(tempfile.mkdtemp(prefix="torchrl_post_launches_"))))
    return _zygote[0]


def torchrun(
    nproc: int, target: list[str], timeout: int = 600, env: dict[str, str] | None = None, real: bool = False
) -> subprocess.CompletedProcess[str]:
    """`torchrun --standalone --nproc-per-node N <target...>`; target is `-m module args` or a script. The ranks
    are forked from the suite's launcher after its imports, with torchrun's worker environment
    (`tests/launcher.py`); `real=True` runs the `torchrun` command itself. A training run draws no plots unless it
    says `trainer.plots=true` (a second per launch; one test checks them)."""
    entry = "torchrl_post.train" in target or any(t.endswith(".py") and "examples" in Path(t).parts for t in target)
    if entry and not any(t.startswith("trainer.plots=") for t in target):
        target = [*target, "trainer.plots=false"]
    start = time.perf_counter()
    try:
        if not real:
            return _launcher().launch(nproc, target, timeout, _env(env))
        return run_cmd([str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", *target], timeout, env)
    finally:
        _launches.append(time.perf_counter() - start)


def benchmark_launches_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark drivers' torchrun launches (`benchmarks.common.run_logged` of `torchrun --standalone
    --nproc-per-node N -m ...`) forked from the suite's launcher, as every other launch of the suite, with the log
    and the failure the driver expects: a test runs a driver in its own process (`main(argv)`) and saves each
    launch's imports (about 9 s of a tiny benchmark's 15-20 s launch on 2 cores). Other commands run as before."""
    from benchmarks import common

    prefix, run_logged = [*common.torchrun(), "--standalone", "--nproc-per-node"], common.run_logged

    def launch(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float | None = None) -> None:
        if cmd[: len(prefix)] != prefix:
            return run_logged(cmd, log, env, timeout)
        proc = torchrun(int(cmd[len(prefix)]), cmd[len(prefix) + 1 :], int(timeout or 600), env)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + proc.stderr)
        common.check_logged(cmd, proc.returncode, log)

    monkeypatch.setattr(common, "run_logged", launch)


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-8000:]}"
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny Qwen2 (hidden 64, 2 layers, head_dim 32) with the demo tokenizer."""
    from torchrl_post.demo.build import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_model")
    build_tiny_model(out, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, seed=0)
    return out


def _untrained(out: Path, config_cls: Any, model_cls: Any, **config: Any) -> Any:
    """An untrained `model_cls` from `config_cls(**config)` (float32, the demo tokenizer's special ids), seed 0,
    saved with the demo tokenizer under `out`; returns the model."""
    import torch

    from torchrl_post.demo.build import save_model
    from torchrl_post.demo.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(128)
    cfg = config_cls(
        vocab_size=128,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
        **config,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_cls(cfg)
    save_model(model, tok, out)
    return model


@pytest.fixture(scope="session")
def tiny_reward_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a reward model: Qwen2ForSequenceClassification (one label, a head drawn from seed 0) with
    the demo tokenizer and its chat template."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    out = tmp_path_factory.mktemp("tiny_reward_model")
    config = AutoConfig.from_pretrained(tiny_model)
    config.num_labels, config.architectures = 1, ["Qwen2ForSequenceClassification"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(tiny_model, config=config)
    model.save_pretrained(out)
    for f in tiny_model.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def tiny_tied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny Llama with tied input/output embeddings (`tie_word_embeddings`, as SmolLM2): hidden 64,
    2 layers, 2 heads (head_dim 32), 1 KV head, the demo tokenizer. Its checkpoint has no `lm_head.weight`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny_tied_model")
    model = _untrained(
        out, LlamaConfig, LlamaForCausalLM, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return out


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny Qwen3-MoE (hidden 64, 2 layers, head_dim 32, 1 KV head; 4 experts, top-2, expert width 64)
    with the demo tokenizer."""
    out = tmp_path_factory.mktemp("tiny_moe_model")
    build_tiny_moe(out)
    return out


def build_tiny_moe(out: Path) -> None:
    """The tiny_moe_model fixture's model, written to `out` (the GPU tier builds it too)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    _untrained(
        out, Qwen3MoeConfig, Qwen3MoeForCausalLM, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_experts=4,
        num_experts_per_tok=2, decoder_sparse_step=1, tie_word_embeddings=False,
    )  # fmt: skip


@pytest.fixture(scope="session")
def tiny_vlms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An untrained tiny vision-language model of each architecture (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) with the
    character tokenizer and its processor: arch -> model dir."""
    from torchrl_post.demo.vlm import ARCHS, build_vlm

    root = tmp_path_factory.mktemp("tiny_vlm")
    return {arch: build_vlm(root / arch, arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo model (warm-started on the sums) and its data, built once per session: (model dir, data dir)."""
    from torchrl_post.demo.build import build_demo

    model, data = demo_dirs(tmp_path_factory)
    prebuild.wait_for_demo(model)
    build_demo(model, data)  # built in the background: found and checked (or built here, if that failed)
    return model, data


@pytest.fixture(scope="session")
def demo_untrained(demo: tuple[Path, Path]) -> Path:
    """The demo model as initialised, before its warm start (what configs/sft.yaml fine-tunes), beside the session's
    demo: `make sft-model`'s build."""
    from torchrl_post.demo.build import build_untrained

    out = demo[0].parent / "untrained"
    build_untrained(out, demo[1])
    return out


@pytest.fixture(scope="session")
def demo_judge_model(demo: tuple[Path, Path]) -> Path:
    """The demo judge (`torchrl_post.demo.judge`) of the session's demo model, built into outputs/demo_judge_model
    and cached there across sessions (its marker names the demo model's fingerprint, the same on every machine), as
    `make judge-model` does: a build takes half a minute, a cached one is checked in a second."""
    from torchrl_post.demo.judge import build_judge

    prebuild.wait("demo_judge_model")
    out = prebuild.JUDGE
    build_judge(out, *demo)
    return out


@pytest.fixture(scope="session")
def demo_reward_model(demo: tuple[Path, Path]) -> Path:
    """The demo reward model (`torchrl_post.demo.reward_model`) of the session's demo model and data, built into
    outputs/demo_reward_model: its marker names the demo model's fingerprint and the data, both the same on every
    machine, so a later session finds it there."""
    from torchrl_post.demo.reward_model import build_reward_model

    prebuild.wait("demo_reward_model")
    out = prebuild.REWARD_MODEL
    build_reward_model(out, *demo)
    return out


@pytest.fixture(scope="session")
def demo_distill_models(demo: tuple[Path, Path]) -> tuple[Path, Path]:
    """The distillation demo's teacher and student (`torchrl_post.demo.distill`) of the session's demo model and data,
    built into outputs/distill_teacher and outputs/distill_student as `make distill-models` does: (teacher, student).
    Their markers name the demo model's fingerprint and the data, the same on every machine, so a later session finds
    them there: a build takes 40-75 s on 2 cores (the teacher's fine-tune most of it), a cached one a second."""
    from torchrl_post.demo.distill import build_distill

    prebuild.wait("demo_distill_models")
    teacher, student = prebuild.TEACHER, prebuild.STUDENT
    build_distill(teacher, student, *demo)
    return teacher, student


@pytest.fixture(scope="session")
def demo_20_steps(demo: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """metrics.jsonl of the default demo, 20 steps on 2 processes (`tests.e2e.golden.record.run_demo`): the
    golden fixture's run, and the baseline other layouts of the same run are compared with."""
    from tests.e2e.golden.record import run_demo

    return run_demo(tmp_path_factory.mktemp("demo_20_steps"), demo)


@pytest.fixture(scope="session")
def task_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from torchrl_post.demo.task import write_task

    return write_task(tmp_path_factory.mktemp("task"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_overrides(model: Path, data: tuple[Path, Path], run: Path, steps: int) -> list[str]:
    """A few small steps of GRPO on the tiny model with a reward that varies even for random weights."""
    return [
        f"model.path={model}",
        f"data.train_files={data[0]}",
        f"data.val_files={data[1]}",
        "data.train_batch_size=4",
        "rollout.n=4",
        "rollout.max_num_seqs=32",
        "actor.lr=1e-2",
        "reward.function=tests.e2e.rewards:digit_fraction",
        "trainer.test_freq=2",
        "trainer.save_freq=2",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run}",
    ]


def resumed_from(run: Path, step: int) -> list[str]:
    """Overrides that resume from `run`'s step-`step` checkpoint: what a kill right after that save leaves, so a
    run resumed from it and trained to N steps must equal `run` trained straight to N (one launch fewer than
    training a second run to `step` first)."""
    return [
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={run / 'checkpoints' / f'global_step_{step}'}",
    ]


def run_config(
    config: str, built: tuple[Path, Path], run: Path, steps: int, *extra: str, nproc: int = 2
) -> tuple[list[dict], str]:
    """`--config-name <config>` through the entrypoint on a built (model dir, data dir), validating at step 0
    and at `steps`; returns the metrics rows and the output."""
    model, data = built
    args = [f"model.path={model}", f"data.train_files={data / 'train.jsonl'}", f"data.val_files={data / 'val.jsonl'}"]
    args += [f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}", f"trainer.default_local_dir={run}"]
    proc = torchrun(nproc, ["-m", "torchrl_post.train", "--config-name", config, *args, *extra])
    assert_ok(proc)
    return read_jsonl(run / "metrics.jsonl"), proc.stdout + proc.stderr


def run_example(script: str, model: Path, run: Path, steps: int, *extra: str, nproc: int = 2) -> tuple[list[dict], str]:
    """examples/<script> (the Python API; the script builds its own datasets) under torchrun on a built model,
    validating at step 0 and at `steps`; returns the metrics rows and the output."""
    args = [f"model.path={model}", f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}"]
    proc = torchrun(nproc, [str(REPO / "examples" / script), *args, f"trainer.default_local_dir={run}", *extra])
    assert_ok(proc)
    return read_jsonl(run / "metrics.jsonl"), proc.stdout + proc.stderr
