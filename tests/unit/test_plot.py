"""Tests of torchrl_post/plot.py: python -m torchrl_post.plot writes every panel, compares runs, fails in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.unit.plot_helpers import _write_run
from torchrl_post.logging.plots import DPI, OVERVIEW_SIZE, PANEL_SIZE, TIMING_WIDTH_PER_RUN
from torchrl_post.plot import main

NAMES = ("reward", "validation", "response_length", "entropy", "kl", "grad_norm")


def _size(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        return im.size


def _px(inches: tuple[float, float]) -> tuple[int, int]:
    return round(inches[0] * DPI), round(inches[1] * DPI)


def test_one_run_writes_every_panel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _write_run(tmp_path / "demo", 12, extra_line='{"training/global_step": 13, "critic/sc')  # cut by a crash
    out = tmp_path / "out"
    main([str(run), "--out", str(out)])
    for name in NAMES:
        assert _size(out / f"{name}.png") == _px(PANEL_SIZE), name
    assert _size(out / "timing.png") == _px(PANEL_SIZE)
    assert _size(out / "overview.png") == _px(OVERVIEW_SIZE)
    assert capsys.readouterr().out.startswith(f"plots (8) in {out}: reward.png, ")


def test_several_runs_share_one_figure(tmp_path: Path) -> None:
    a = _write_run(tmp_path / "runs" / "a", 10)
    b = _write_run(tmp_path / "runs" / "b", 6, offset=0.2)
    main([str(a), str(b / "metrics.jsonl")])  # no --out: beside the runs; a metrics.jsonl stands for its run
    out = tmp_path / "runs" / "compare_plots"
    for name in NAMES:
        assert _size(out / f"{name}.png") == _px(PANEL_SIZE)
    assert _size(out / "timing.png") == _px((2 * TIMING_WIDTH_PER_RUN, PANEL_SIZE[1])), "one axes a run"


def test_missing_metrics_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write_run(tmp_path / "good", 3)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        main([str(good), str(tmp_path / "empty"), str(tmp_path / "nope")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "empty has no metrics.jsonl" in err[0] and "nope does not exist" in err[0]
    assert not (good / "plots").exists(), "nothing written when a directory is wrong"


def test_cli_process_exit_code_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torchrl_post.plot", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {tmp_path / 'nope'} does not exist"


def test_train_args_plot_the_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _write_run(tmp_path / "demo", 4)
    main(["--train-args", f"trainer.default_local_dir={run}", "trainer.total_training_steps=4"])
    assert (run / "plots" / "timing.png").exists()
    main(["--train-args", f"trainer.default_local_dir={run}", "trainer.dry_run=true"])
    assert capsys.readouterr().out.splitlines()[-1] == "plots: none (the run logged no training step)"


def test_a_baseline_is_a_horizontal_line_on_the_validation_panel_only(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from torchrl_post.logging.plots import PANELS, _draw_panel, read_metrics

    runs = [("a", read_metrics(_write_run(tmp_path / "a", 6)))]
    panels = {p.name: p for p in PANELS}
    fig, (val, reward) = plt.subplots(1, 2)
    assert _draw_panel(val, panels["validation"], runs, [("teacher", 0.9)])
    assert _draw_panel(reward, panels["reward"], runs, [("teacher", 0.9)])
    plt.close(fig)
    line = next(ln for ln in val.get_lines() if ln.get_label() == "teacher (0.9)")
    assert list(line.get_ydata()) == [0.9, 0.9]
    assert "teacher (0.9)" in val.get_legend_handles_labels()[1]
    assert all("teacher" not in str(ln.get_label()) for ln in reward.get_lines())
    main([str(tmp_path / "a"), "--out", str(tmp_path / "out"), "--baseline", "teacher=0.9"])
    assert _size(tmp_path / "out" / "validation.png") == _px(PANEL_SIZE)


def test_a_baseline_without_a_score_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _write_run(tmp_path / "a", 3)
    with pytest.raises(SystemExit) as e:
        main([str(run), "--baseline", "teacher"])
    assert e.value.code == 2
    assert "expected LABEL=SCORE" in capsys.readouterr().err
