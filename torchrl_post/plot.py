"""Plot runs from their metrics.jsonl: reward, validation, response length, entropy, KL, gradient norm, and the
time per step by stage (a stacked area), several runs overlaid with their directory names in the legend.

    python -m torchrl_post.plot RUN_DIR [RUN_DIR ...] [--out DIR] [--baseline LABEL=SCORE ...]
    python -m torchrl_post.plot --train-args [--config-name NAME] [key=value ...]

One run writes into RUN_DIR/plots/; several into --out (by default `compare_plots/` in their common parent
directory). `--baseline teacher=0.99` draws a score (a teacher's validation, a model's before training) as a
horizontal line on the validation panel. `--train-args` takes the training command's own arguments and plots that run's directory
(trainer.default_local_dir), as `make train` does at its end (a dry run or a validation-only run: nothing to
plot, exit code 0). A RUN_DIR without metrics.jsonl is one error line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from torchrl_post.logging.plots import plot_runs, read_metrics


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def run_dir_of_train_args(argv: list[str]) -> Path | None:
    """The run directory a `torchrl_post.train` command with these arguments writes metrics.jsonl to; None for a
    dry run or a validation-only run (they write none)."""
    from torchrl_post.config import UserError
    from torchrl_post.config.load import load_command_line

    try:
        t = load_command_line(argv).trainer
    except UserError as e:
        _fail(str(e))
        raise  # unreachable: _fail exits
    return None if t.dry_run or t.val_only else Path(t.default_local_dir)


def _baseline(text: str) -> tuple[str, float]:
    label, sep, score = text.rpartition("=")
    try:
        if sep and label:
            return label, float(score)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"--baseline {text!r}: expected LABEL=SCORE, e.g. teacher=0.99")


def default_out(run_dirs: list[Path]) -> Path:
    if len(run_dirs) == 1:
        return run_dirs[0] / "plots"
    common = Path(os.path.commonpath([p.resolve() for p in run_dirs]))
    return (common if common.parent != common else Path.cwd()) / "compare_plots"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--train-args"]:
        run_dir = run_dir_of_train_args(argv[1:])
        if run_dir is None or not read_metrics(run_dir):
            print("plots: none (the run logged no training step)", flush=True)
            return
        run_dirs, out, baselines = [run_dir], None, []
    else:
        parser = argparse.ArgumentParser(
            prog="python -m torchrl_post.plot", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
        )
        parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories to plot")
        parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (made if missing)")
        parser.add_argument(
            "--baseline", action="append", default=[], type=_baseline, metavar="LABEL=SCORE",
            help="a horizontal line on the validation panel (repeatable), e.g. teacher=0.99",
        )  # fmt: skip
        args = parser.parse_args(argv)
        run_dirs, out, baselines = args.run_dirs, args.out, args.baseline
    # a metrics.jsonl given for its run directory
    run_dirs = [p.parent if p.name.endswith(".jsonl") and p.is_file() else p for p in run_dirs]
    problems = []
    for d in run_dirs:
        if not (d / "metrics.jsonl").is_file():
            why = "does not exist" if not d.exists() else "has no metrics.jsonl (not a run directory, or no step yet)"
            problems.append(f"{d} {why}")
        elif not read_metrics(d):
            problems.append(f"{d / 'metrics.jsonl'} has no rows with training/global_step")
    if problems:
        _fail("; ".join(problems))
    out_dir = out if out is not None else default_out(run_dirs)
    written = plot_runs(run_dirs, out_dir, baselines=baselines)
    print(f"plots ({len(written)}) in {out_dir}: {', '.join(p.name for p in written)}", flush=True)


if __name__ == "__main__":
    main()
