"""Progress bars (tqdm) for a terminal: the run over its steps, and long loops such as validation's chunks.

Only when stdout is a terminal: piped or redirected output (a Slurm log, `| tee`) keeps one plain line per step
and no bar, so logs stay greppable. While the run's bar is up, log records are routed through `tqdm.write` so
they print above the bar instead of breaking it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# The bar's postfix: (metrics key, label, format); validation scores are added per data source.
POSTFIX = (
    ("critic/score/mean", "reward", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("timing_s/step", "step_s", "{:.2f}"),
)


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stdout
        return False


def progress(iterable: Iterable[T], total: int, desc: str, enabled: bool = True, min_total: int = 2) -> Iterator[T]:
    """`iterable` with a transient bar (left off when done) on a terminal when `enabled` and it has at least
    `min_total` items; the iterable itself otherwise. For validation's chunks on the rank that reports them."""
    if not (enabled and total >= min_total and stdout_is_terminal()):
        yield from iterable
        return
    from tqdm import tqdm

    with tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True, file=sys.stdout) as bar:
        yield from bar


class RunProgress:
    """The run's bar over `total` steps, starting at `initial` (a resumed run), with reward and validation."""

    def __init__(self, total: int, initial: int = 0) -> None:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(logging_redirect_tqdm(loggers=[logging.getLogger()]))
        self.bar: Any = tqdm(
            total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True, file=sys.stdout
        )
        self.val: dict[str, float] = {}

    def update(self, metrics: dict[str, float]) -> None:
        step = int(metrics.get("training/global_step", 0))
        post = {label: fmt.format(metrics[key]) for key, label, fmt in POSTFIX if metrics.get(key) is not None}
        self.val |= {
            k.removeprefix("val/test_score/"): v
            for k, v in metrics.items()
            if k.startswith("val/test_score/") and "@" not in k and v is not None
        }
        post |= {f"val {src}": f"{v:.3f}" for src, v in self.val.items()}
        self.bar.set_postfix(post, refresh=False)
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)
        else:
            self.bar.refresh()

    def write(self, line: str) -> None:
        """A line above the bar (the console logger's line)."""
        self.bar.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()
        self._stack.close()
