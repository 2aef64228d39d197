"""torchrl_post/config/errors.py: a rank's line on stderr is one write, so ranks sharing the stream never join lines."""

from __future__ import annotations

import io
import sys

import pytest

from torchrl_post.config.errors import stderr_line


class _Writes(io.RawIOBase):
    """A raw stream that keeps each write it is given (what reaches the file descriptor, one call each)."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def, override]
        self.calls.append(bytes(b))
        return len(b)


def _unbuffered(raw: _Writes) -> io.TextIOWrapper:
    """stderr as PYTHONUNBUFFERED makes it: every write goes through at once."""
    return io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # type: ignore[arg-type]


def test_a_line_is_one_write_where_print_makes_two(monkeypatch: pytest.MonkeyPatch) -> None:
    line = "error: rank 1 (rollout) last in 'gen' at step 2: silent for 6 s"
    printed = _Writes()
    print(line, file=_unbuffered(printed), flush=True)
    assert printed.calls == [line.encode(), b"\n"]  # what joined two ranks' lines
    ours = _Writes()
    monkeypatch.setattr(sys, "stderr", _unbuffered(ours))
    stderr_line(line)
    assert ours.calls == [(line + "\n").encode()]
