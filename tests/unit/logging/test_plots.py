"""Tests of torchrl_post/logging/plots.py: legends, the timing stack and plot_run's contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.plot_helpers import _write_run
from torchrl_post.logging.plots import plot_run, stage_table


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


def test_plot_run_keeps_its_contract(tmp_path: Path) -> None:
    assert plot_run(tmp_path) is None, "no metrics.jsonl: nothing to plot"
    assert plot_run(_write_run(tmp_path / "r", 3)) == tmp_path / "r" / "plots" / "reward.png"
    only_val = tmp_path / "v"
    only_val.mkdir()
    (only_val / "metrics.jsonl").write_text(json.dumps({"training/global_step": 0, "val/test_score/a": 0.5}) + "\n")
    assert plot_run(only_val) == only_val / "plots" / "validation.png"
