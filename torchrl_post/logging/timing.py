"""Stage timings of one step: `with timer("gen"): ...` or `timer.timed("gen", fn, *args)` -> `timing_s/gen`.
A timed stage is also the rank's stage for the liveness watch (distributed/liveness.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from torchrl_post.distributed import liveness

T = TypeVar("T")


class Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        liveness.enter(name)
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - t

    def timed(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), timed as `name`."""
        with self(name):
            return fn(*args)

    def reset(self) -> None:
        self.seconds = {}

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}
