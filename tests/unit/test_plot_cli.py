"""python -m torchrl_post.plot: PNGs per panel from metrics.jsonl written by hand, several runs on one figure,
the timing stack, one error line for a directory without metrics.jsonl, and `--train-args` as `make train` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from torchrl_post.logging.plots import DPI, OVERVIEW_SIZE, PANEL_SIZE, TIMING_WIDTH_PER_RUN, plot_run, stage_table
from torchrl_post.plot import main

NAMES = ("reward", "validation", "response_length", "entropy", "kl", "grad_norm")


def _write_run(run: Path, steps: int, offset: float = 0.0, extra_line: str = "") -> Path:
    run.mkdir(parents=True)
    rows: list[dict[str, Any]] = [{"training/global_step": 0, "val/test_score/arith": 0.2 + offset}]
    for s in range(1, steps + 1):
        row: dict[str, Any] = {
            "training/global_step": s,
            "critic/score/mean": 0.1 * s + offset,
            "response_length/mean": 5.0 + s,
            "response_length/max": 9.0,
            "actor/entropy": 1.0 / s,
            "actor/ppo_kl": 0.01 * s,
            "actor/grad_norm": None if s == 2 else 1.5,  # non-finite, written as null
            "timing_s/gen": 0.3,
            "timing_s/reward": 0.05,
            "timing_s/update_actor": 0.4,
            "timing_s/sync": 0.05,
            "timing_s/gen_engine": 0.25,  # overlaps gen: not a stage
            "timing_s/step": 1.0,
        }
        if s % 3 == 0:
            row |= {"val/test_score/arith": 0.3 + offset + 0.01 * s, "timing_s/testing": 0.5}
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + extra_line)
    return run


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


def test_legend_names_the_runs(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from torchrl_post.logging.plots import PANELS, _draw_panel, read_metrics, run_labels

    dirs = [_write_run(tmp_path / "x" / "demo", 4), _write_run(tmp_path / "y" / "demo", 4)]
    labels = run_labels(dirs)
    assert labels == ["x/demo", "y/demo"], "equal names: their paths below the common parent"
    fig, ax = plt.subplots()
    _draw_panel(ax, PANELS[0], [(label, read_metrics(d)) for label, d in zip(labels, dirs, strict=True)])
    legend = ax.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["x/demo", "y/demo"]
    plt.close(fig)


def test_timing_stack_adds_up_to_the_wall_time(tmp_path: Path) -> None:
    from torchrl_post.logging.plots import read_metrics

    steps, table, totals = stage_table(read_metrics(_write_run(tmp_path / "r", 6)))
    assert steps == [1, 2, 3, 4, 5, 6]
    assert list(table) == ["gen", "reward", "update_actor", "sync", "other", "testing"]
    for i in range(len(steps)):
        assert sum(v[i] for v in table.values()) == pytest.approx(totals[i])
    assert totals == pytest.approx([1.0, 1.0, 1.5, 1.0, 1.0, 1.5])


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


def test_plot_run_keeps_its_contract(tmp_path: Path) -> None:
    assert plot_run(tmp_path) is None, "no metrics.jsonl: nothing to plot"
    assert plot_run(_write_run(tmp_path / "r", 3)) == tmp_path / "r" / "plots" / "reward.png"
    only_val = tmp_path / "v"
    only_val.mkdir()
    (only_val / "metrics.jsonl").write_text(json.dumps({"training/global_step": 0, "val/test_score/a": 0.5}) + "\n")
    assert plot_run(only_val) == only_val / "plots" / "validation.png"
