"""One-line error messages, checked for the tests of several modules."""

from __future__ import annotations

from typing import Any

import pytest


def _one_line(exc: pytest.ExceptionInfo[Any]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg.strip(), f"must be one line: {msg!r}"
    return msg
