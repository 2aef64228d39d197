"""Tests of torchrl_post/logging/metrics.py: metrics.jsonl, console, bar, tensorboard and wandb; truncate_history."""

from __future__ import annotations

import importlib.util
import json
import math
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from torchrl_post.config import load_config
from torchrl_post.config.errors import ConfigError
from torchrl_post.logging import metrics as metrics_mod
from torchrl_post.logging.metrics import LOGGERS, MetricsLogger, truncate_history
from torchrl_post.logging.plots import plot_run

# --- metrics.jsonl and the console --------------------------------------------------------------------------


def test_jsonl_console_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logger = MetricsLogger(tmp_path, ["console"], True, 2, {}, "p", "e")
    logger.log({"training/global_step": 0, "val/test_score/arithmetic": 0.25})
    logger.log(
        {
            "training/global_step": 1,
            "critic/score/mean": 0.5,
            "timing_s/step": 0.3,
            "_private": 1.0,
            "actor/grad_norm": float("nan"),
        }
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[1] == {
        "training/global_step": 1,
        "critic/score/mean": 0.5,
        "timing_s/step": 0.3,
        "actor/grad_norm": None,
    }
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "step 0/2 | arithmetic val 0.250"
    assert out[1] == "step 1/2 | reward 0.500 | step_s 0.30"
    png = plot_run(tmp_path)
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"


def test_non_main_rank_writes_nothing(tmp_path: Path) -> None:
    MetricsLogger(tmp_path / "run", ["console"], False, 1, {}, "p", "e").log({"training/global_step": 1})
    assert not (tmp_path / "run").exists()


def test_wandb_offline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = MetricsLogger(tmp_path, ["wandb"], True, 1, {"actor": {"lr": 0.1}}, "proj", "exp")
    logger.log({"training/global_step": 1, "critic/score/mean": 0.5})
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "wandb wrote no offline run"


# --- trainer.logger: tensorboard, wandb and the progress bar ------------------------------------------------


needs_tb = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")


def _row(step: int, **extra: float) -> dict[str, float]:
    return {
        "training/global_step": step,
        "critic/score/mean": 0.1 * step,
        "actor/loss": -0.01 * step,
        "actor/grad_norm": 1.0 + step,
        "timing_s/gen": 0.2,
        "timing_s/step": 0.5,
        **extra,
    }


def _jsonl(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _read_tb(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _jsonl_series(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in rows:
        for k, v in r.items():
            if v is not None:
                out.setdefault(k, []).append(int(r["training/global_step"]))
    return out


@needs_tb
def test_tensorboard_holds_the_jsonl_tags_and_steps(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, ["tensorboard"], True, 3, {"actor": {"lr": 0.1}}, "p", "e")
    logger.start_fresh()
    logger.log({"training/global_step": 0, "val/test_score/arith": 0.25})
    logger.log(_row(1, **{"actor/entropy": float("nan")}))  # non-finite: null in jsonl, absent in tensorboard
    logger.log(_row(2, **{"actor/entropy": 0.7}))
    logger.log(_row(3, **{"val/test_score/arith": 0.5, "timing_s/testing": 0.1, "_private": 1.0}))
    logger.close()
    rows = _jsonl(tmp_path)
    tb = _read_tb(tmp_path)
    want = _jsonl_series(rows)
    assert set(tb) == set(want), "tensorboard's scalar tags are metrics.jsonl's keys"
    assert {k: [s for s, _ in v] for k, v in tb.items()} == want
    steps = sorted({s for v in tb.values() for s, _ in v})
    assert steps == [int(r["training/global_step"]) for r in rows] == [0, 1, 2, 3]
    assert math.isclose(dict(tb["critic/score/mean"])[2], 0.2, rel_tol=1e-6)
    assert tb["actor/entropy"] == [(2, pytest.approx(0.7))]


def _next_second() -> None:
    """Event files are named by the second they open in; a new file must sort after the last one."""
    time.sleep(1.02 - time.time() % 1)


@needs_tb
def test_tensorboard_resume_purges_steps_after_the_checkpoint(tmp_path: Path) -> None:
    first = MetricsLogger(tmp_path, ["tensorboard"], True, 6, {}, "p", "e")
    first.start_fresh()
    for step in range(1, 6):  # crashed after logging step 5; the last checkpoint is step 3
        first.log(_row(step))
    first.close()
    _next_second()
    second = MetricsLogger(tmp_path, ["tensorboard"], True, 6, {}, "p", "e")
    second.resume_from(3)
    for step in range(4, 7):
        second.log(_row(step, **{"critic/score/mean": 10.0 * step}))
    second.close()
    rows = _jsonl(tmp_path)
    tb = _read_tb(tmp_path)
    assert [int(r["training/global_step"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert {k: [s for s, _ in v] for k, v in tb.items()} == _jsonl_series(rows), "no step shows twice"
    assert [v for _, v in tb["critic/score/mean"]] == pytest.approx([0.1, 0.2, 0.3, 40.0, 50.0, 60.0])


@needs_tb
def test_fresh_start_sets_earlier_event_files_aside(tmp_path: Path) -> None:
    first = MetricsLogger(tmp_path, ["tensorboard"], True, 2, {}, "p", "e")
    first.start_fresh()
    first.log(_row(1))
    first.close()
    second = MetricsLogger(tmp_path, ["tensorboard"], True, 2, {}, "p", "e")
    second.start_fresh()
    second.log(_row(1, **{"critic/score/mean": 0.9}))
    second.close()
    assert (tmp_path / "tensorboard.1.old").is_dir() and (tmp_path / "metrics.1.jsonl.old").exists()
    assert _read_tb(tmp_path)["critic/score/mean"] == [(1, pytest.approx(0.9))]


def test_non_main_rank_opens_no_tensorboard(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path / "run", ["tensorboard", "console"], False, 1, {}, "p", "e")
    logger.start_fresh()
    logger.log(_row(1))
    logger.close()
    assert not (tmp_path / "run").exists()


def test_unknown_logger_is_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.logger='tensorbored' is not one of console, wandb, tensorboard"):
        MetricsLogger(tmp_path, ["console", "tensorbored"], True, 1, {}, "p", "e")
    with pytest.raises(ConfigError, match=r"trainer\.logger='mlflow' is not one of .*tensorboard"):
        load_config(["trainer.logger=[console,mlflow]"])
    assert load_config(["trainer.logger=[console,wandb,tensorboard]"]).trainer.logger == list(LOGGERS)


def test_missing_package_is_one_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name))
    # every rank checks, not only the one that writes
    with pytest.raises(ConfigError, match=r"trainer\.logger lists tensorboard .*\(pip install tensorboard\)"):
        MetricsLogger(tmp_path, ["tensorboard"], False, 1, {}, "p", "e")


def _wandb_teardown() -> None:
    if importlib.util.find_spec("wandb") is not None:
        import wandb

        wandb.teardown()


@pytest.fixture
def no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A listening socket that every proxy and W&B's base URL point at: a connection to it is a network attempt."""
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(8)
    trap.setblocking(False)
    url = f"http://127.0.0.1:{trap.getsockname()[1]}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "WANDB_BASE_URL"):
        monkeypatch.setenv(var, url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no ~/.config/wandb
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    _wandb_teardown()  # W&B keeps its settings (the mode among them) in a per-process singleton
    yield trap
    _wandb_teardown()
    try:
        trap.accept()
        pytest.fail("something connected to the network trap")
    except BlockingIOError:
        pass
    finally:
        trap.close()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline_stays_under_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: Any
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    logger = MetricsLogger(run, ["wandb"], True, 2, {"actor": {"lr": 0.1}}, "proj", "exp")
    logger.start_fresh()
    logger.log(_row(1))
    logger.log(_row(2, **{"actor/grad_norm": float("inf")}))
    logger.close()
    runs = list((run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    assert [int(r["training/global_step"]) for r in _jsonl(run)] == [1, 2]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_without_login_is_one_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: Any
) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(ConfigError, match=r"trainer\.logger lists wandb .*WANDB_MODE=offline"):
        MetricsLogger(tmp_path / "run", ["wandb"], True, 1, {}, "p", "e")


def test_no_bar_off_the_main_rank_or_without_console(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_mod, "stdout_is_terminal", lambda: True)
    assert not MetricsLogger(tmp_path / "a", ["console"], False, 4, {}, "p", "e").bar_wanted
    assert not MetricsLogger(tmp_path / "b", [], True, 4, {}, "p", "e").bar_wanted


def test_progress_bar_and_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(metrics_mod, "stdout_is_terminal", lambda: True)
    logger = MetricsLogger(tmp_path, ["console"], True, 4, {}, "p", "e")
    logger.resume_from(1)
    logger.log(_row(2))
    logger.log(_row(3, **{"val/test_score/arith": 0.75}))
    assert logger.bar is not None and logger.bar.bar.n == 3
    logger.close()
    out = capsys.readouterr().out
    assert "step 2/4 | reward 0.200" in out and "step 3/4 | reward 0.300" in out, "the console lines stay"
    assert "train:" in out and "3/4" in out and "val arith=0.750" in out, "the bar, with reward and validation"


def test_no_bar_when_not_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logger = MetricsLogger(tmp_path, ["console"], True, 2, {}, "p", "e")
    logger.log(_row(1))
    logger.log(_row(2))
    logger.close()
    assert logger.bar is None
    assert capsys.readouterr().out.splitlines() == [
        "step 1/2 | reward 0.100 | loss -0.0100 | step_s 0.50",
        "step 2/2 | reward 0.200 | loss -0.0200 | step_s 0.50",
    ]


# --- truncate_history: on resume, metrics.jsonl keeps rows through the resumed step only --------------------


def _json_line(step: int, **extra) -> str:
    return json.dumps({"training/global_step": step, **extra})


def _steps(path) -> list[int]:
    return [json.loads(line)["training/global_step"] for line in path.read_text().splitlines()]


def test_truncate_history_keeps_through_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_json_line(s, loss=s / 10) + "\n" for s in range(6)))
    dropped = truncate_history(path, 3)
    assert dropped == 2
    assert _steps(path) == [0, 1, 2, 3]
    # the kept rows are unchanged, byte for byte
    assert path.read_text() == "".join(_json_line(s, loss=s / 10) + "\n" for s in range(4))


def test_truncate_history_drops_cut_short_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        _json_line(0) + "\n" + _json_line(1) + "\n" + _json_line(2) + "\n" + '{"training/global_step": 3, "actor/lo'
    )
    dropped = truncate_history(path, 5)
    assert dropped == 1
    assert _steps(path) == [0, 1, 2]
    assert path.read_text().endswith("\n")


def test_truncate_history_drops_later_rows_and_cut_short_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        _json_line(0) + "\n" + _json_line(1) + "\n" + _json_line(2) + "\n" + _json_line(3) + "\n" + '{"training/glo'
    )
    assert truncate_history(path, 1) == 3
    assert _steps(path) == [0, 1]


def test_truncate_history_row_without_step_counts_as_step_zero(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"val/test_score/arithmetic": 0.1}) + "\n" + _json_line(4) + "\n")
    assert truncate_history(path, 0) == 1
    assert path.read_text() == json.dumps({"val/test_score/arithmetic": 0.1}) + "\n"


def test_truncate_history_nothing_to_drop(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = _json_line(1) + "\n" + _json_line(2) + "\n"
    path.write_text(text)
    assert truncate_history(path, 2) == 0
    assert path.read_text() == text
    assert not (tmp_path / "metrics.tmp").exists()


def test_truncate_history_missing_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert truncate_history(path, 3) == 0
    assert not path.exists()


def test_wandb_without_a_key_is_refused_before_anything_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same refusal from the credentials alone (api.run checks them before the engine and the models load);
    a key, a netrc login or an offline mode passes."""
    from torchrl_post.logging.metrics import check_loggers

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("NETRC", raising=False)
    with pytest.raises(ConfigError, match=r"trainer\.logger lists wandb .*no API key.*WANDB_MODE=offline"):
        check_loggers(["console", "wandb"])
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    (tmp_path / ".netrc").chmod(0o600)
    check_loggers(["wandb"])
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_loggers(["wandb"])
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    check_loggers(["wandb"])
