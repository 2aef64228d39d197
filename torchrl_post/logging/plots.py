"""Plots from metrics.jsonl, one PNG per panel plus an overview grid; several runs overlaid on one figure.

    python -m torchrl_post.plot outputs/demo                     # -> outputs/demo/plots/*.png
    python -m torchrl_post.plot runs/a runs/b --out runs/compare  # a and b on the same axes

Panels: reward (training score with a moving mean), validation (`val/test_score/*`), the SFT loss (`train/loss`,
`val/loss`), response length, entropy,
KL, gradient norm (line plots against the step), and timing: the stages of each step (`timing_s/*`) as a stacked
area, one axes per run, whose top edge is the step's wall time (`timing_s/step`, plus `timing_s/testing` on
validation steps). A panel with no data in any run is left out.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP = "training/global_step"
DPI = 100
PANEL_SIZE = (7.0, 4.2)  # inches: 700 x 420 pixels at DPI
OVERVIEW_SIZE = (15.0, 8.4)  # six line panels, 2 x 3: 1500 x 840 pixels
TIMING_WIDTH_PER_RUN = 5.5
# The step's stages in pipeline order (the stack's order, bottom up); others follow sorted. `step` is the total and
# `gen_engine` (the rollout ranks' own time, overlapping `gen`) is not a stage; `testing` runs after the step.
STAGE_ORDER = (
    "data",
    "gen",
    "reward",
    "reward_model",
    "old_log_prob",
    "ref",
    "teacher",
    "values",
    "wait_reward_model",
    "adv",
    "update_critic",
    "update_actor",
    "wait_critic",
    "sync",
)
NOT_STAGES = ("step", "gen_engine", "testing")


@dataclass(frozen=True)
class Panel:
    name: str
    title: str
    ylabel: str
    keys: tuple[str, ...] = ()
    prefix: str | None = None  # every key starting with it (validation: one curve per data source)
    smooth: bool = False
    markers: bool = False

    def keys_in(self, rows: list[dict[str, Any]]) -> list[str]:
        if self.prefix is None:
            return [k for k in self.keys if any(r.get(k) is not None for r in rows)]
        return sorted({k for r in rows for k, v in r.items() if k.startswith(self.prefix) and v is not None})


PANELS = (
    Panel("reward", "training reward", "mean score", ("critic/score/mean",), smooth=True),
    Panel("validation", "validation", "score", prefix="val/test_score/", markers=True),
    Panel("loss", "supervised loss", "NLL per token", ("train/loss", "val/loss"), markers=True),
    Panel("response_length", "response length", "tokens", ("response_length/mean", "response_length/max")),
    Panel("entropy", "policy entropy", "nats per token", ("actor/entropy",)),
    Panel("kl", "KL", "KL", ("actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty")),
    Panel("grad_norm", "gradient norm", "norm (before clipping)", ("actor/grad_norm", "critic/grad_norm")),
)
LINESTYLES = ("-", "--", ":", "-.")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's rows ([] when there is none); a line cut short by a crash is skipped."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get(STEP), int | float):
            rows.append(row)
    return rows


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key`, sorted by step, null (non-finite) values left out; a repeated step keeps its last."""
    by_step: dict[float, float] = {}
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and math.isfinite(v):
            by_step[float(r[STEP])] = float(v)
    xs = sorted(by_step)
    return xs, [by_step[x] for x in xs]


def moving_mean(ys: list[float], k: int) -> list[float]:
    return [sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1]) for i in range(len(ys))]


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """The runs' directory names; their paths below the common parent where names repeat."""
    names = [p.resolve().name or str(p) for p in run_dirs]
    if len(set(names)) == len(names):
        return names
    resolved = [p.resolve() for p in run_dirs]
    common = Path(os.path.commonpath(resolved)) if len(resolved) > 1 else resolved[0].parent
    names = [str(p.relative_to(common)) if p != common else p.name for p in resolved]
    return names if len(set(names)) == len(names) else [f"{n} ({i})" for i, n in enumerate(names, 1)]


def _draw_panel(
    ax: Any, panel: Panel, runs: list[tuple[str, list[dict[str, Any]]]], baselines: Sequence[tuple[str, float]] = ()
) -> bool:
    """One panel on `ax`, every run in its own colour, each key in its own line style, and on the validation panel
    each of `baselines` (label, score) as a grey horizontal line; False when no data."""
    drawn = False
    for i, (label, rows) in enumerate(runs):
        color = f"C{i % 10}"
        for j, key in enumerate(panel.keys_in(rows)):
            xs, ys = series(rows, key)
            if not xs:
                continue
            short = key.removeprefix(panel.prefix) if panel.prefix else key
            name = label if len(runs) > 1 else short
            if len(runs) > 1 and (len(panel.keys_in(rows)) > 1 or panel.prefix):
                name = f"{label}: {short}"
            style = LINESTYLES[j % len(LINESTYLES)]
            k = len(ys) // 10
            if panel.smooth and k > 1:
                ax.plot(xs, ys, color=color, lw=0.8, alpha=0.35, ls=style)
                ax.plot(xs, moving_mean(ys, k), color=color, lw=2, ls=style, label=f"{name} (mean of {k})")
            else:
                marker = "o" if panel.markers or len(xs) == 1 else None
                ax.plot(xs, ys, color=color, lw=1.5, ls=style, marker=marker, ms=4, label=name)
            drawn = True
    if drawn and panel.name == "validation":
        for j, (name, score) in enumerate(baselines):
            ax.axhline(
                score, color="0.35", lw=1.5, ls=LINESTYLES[(j + 1) % len(LINESTYLES)], label=f"{name} ({score:g})"
            )
    ax.set(title=panel.title, xlabel="step", ylabel=panel.ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    if drawn:
        n_labels = len(ax.get_legend_handles_labels()[1])
        ax.legend(loc="best", fontsize="small" if n_labels <= 4 else "x-small")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    return drawn


def stage_table(rows: list[dict[str, Any]]) -> tuple[list[float], dict[str, list[float]], list[float]]:
    """(steps, {stage: seconds per step}, the step's wall time) for the stacked timing area: the named stages,
    `other` (the rest of timing_s/step), then `testing`; a stage missing at a step counts 0."""
    rows = [r for r in rows if isinstance(r.get("timing_s/step"), int | float)]
    found = {k.removeprefix("timing_s/") for r in rows for k in r if k.startswith("timing_s/")}
    stages = [s for s in STAGE_ORDER if s in found] + sorted(found - set(STAGE_ORDER) - set(NOT_STAGES))
    by_step = {float(r[STEP]): r for r in rows}  # a repeated step keeps its last row
    steps = sorted(by_step)

    def get(r: dict[str, Any], key: str) -> float:
        v = r.get(key)
        return float(v) if isinstance(v, int | float) and math.isfinite(v) else 0.0

    table = {s: [get(by_step[x], f"timing_s/{s}") for x in steps] for s in stages}
    walls = [get(by_step[x], "timing_s/step") for x in steps]
    table["other"] = [max(0.0, w - sum(table[s][i] for s in stages)) for i, w in enumerate(walls)]
    testing = [get(by_step[x], "timing_s/testing") for x in steps]
    if any(testing):
        table["testing"] = testing
    totals = [w + t for w, t in zip(walls, testing, strict=True)]
    return steps, {s: v for s, v in table.items() if any(v)}, totals


def _draw_timing(plt: Any, runs: list[tuple[str, list[dict[str, Any]]]], out: Path) -> bool:
    tables = [(label, *stage_table(rows)) for label, rows in runs]
    tables = [t for t in tables if t[1]]
    if not tables:
        return False
    stages: list[str] = []
    for _, _, table, _ in tables:
        stages += [s for s in table if s not in stages]
    cmap = plt.get_cmap("tab10" if len(stages) <= 10 else "tab20")
    colors = {s: cmap(i % cmap.N) for i, s in enumerate(stages)}
    width = max(PANEL_SIZE[0], TIMING_WIDTH_PER_RUN * len(tables))
    fig, axes = plt.subplots(1, len(tables), figsize=(width, PANEL_SIZE[1]), sharey=True, squeeze=False)
    for ax, (label, steps, table, totals) in zip(axes[0], tables, strict=True):
        ax.stackplot(steps, *table.values(), labels=list(table), colors=[colors[s] for s in table], alpha=0.85)
        ax.plot(steps, totals, color="black", lw=0.8, label="wall time")
        ax.set(title=f"time per step by stage: {label}", xlabel="step")
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0][0].set_ylabel("seconds")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_legend_handles_labels()[0]}
    handles = {s: handles[s] for s in [*stages, "wall time"] if s in handles}
    axes[0][-1].legend(
        list(handles.values()), list(handles), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return True


def plot_runs(
    run_dirs: Sequence[Path],
    out_dir: Path,
    labels: Sequence[str] | None = None,
    baselines: Sequence[tuple[str, float]] = (),
) -> list[Path]:
    """Write the panels of every run (those with rows) into `out_dir`, with `baselines` (label, score: a teacher's
    or another model's validation score) as horizontal lines on the validation panel; returns the PNGs written,
    reward.png first."""
    labels = list(labels) if labels is not None else run_labels(run_dirs)
    runs = [(label, rows) for label, d in zip(labels, run_dirs, strict=True) if (rows := read_metrics(d))]
    if not runs:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    suffix = f": {runs[0][0]}" if len(runs) == 1 else ""
    for panel in PANELS:
        fig, ax = plt.subplots(figsize=PANEL_SIZE)
        if _draw_panel(ax, panel, runs, baselines):
            ax.set_title(panel.title + suffix)
            fig.tight_layout()
            written.append(out_dir / f"{panel.name}.png")
            fig.savefig(written[-1], dpi=DPI)
        plt.close(fig)
    if _draw_timing(plt, runs, out_dir / "timing.png"):
        written.append(out_dir / "timing.png")
    fig, axes = plt.subplots(2, 3, figsize=OVERVIEW_SIZE)
    # the first six panels with data (an RL run has no supervised loss, an SFT run no reward)
    shown = [p for p in PANELS if any(p.keys_in(rows) for _, rows in runs)][:6]
    for i, ax in enumerate(axes.flat):
        if i < len(shown):
            _draw_panel(ax, shown[i], runs, baselines)
        else:
            ax.axis("off")
    fig.suptitle(", ".join(label for label, _ in runs))
    fig.tight_layout()
    written.append(out_dir / "overview.png")
    fig.savefig(written[-1], dpi=DPI)
    plt.close(fig)
    return written


def plot_run(run_dir: Path) -> Path | None:
    """Write `run_dir/plots/*.png` (see the module doc); returns plots/reward.png (the other PNGs lie beside it),
    or the first PNG written when the run has no training reward yet; None when metrics.jsonl has no rows."""
    written = plot_runs([run_dir], run_dir / "plots")
    return written[0] if written else None
