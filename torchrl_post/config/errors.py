"""User-facing errors: one sentence naming the key, file or line, and the fix."""

from __future__ import annotations

import sys


class UserError(ValueError):
    """An error the user can fix (bad config, bad data, bad path). Reported as one line, no traceback."""


class ConfigError(UserError):
    """A config key with a bad value, an unknown key, or an impossible combination."""


class DataError(UserError):
    """A data file that is missing, malformed, or empty after filtering."""


class TrainingError(UserError):
    """Training cannot go on (e.g. repeated non-finite updates); the last good checkpoint is kept."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (whitespace collapsed, cut at `limit` characters)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def stderr_line(text: str) -> None:
    """`text` and its newline on stderr in one write, flushed. `print` writes the newline apart, and where stderr is
    unbuffered (PYTHONUNBUFFERED) that is a second write: two ranks' lines on one stream then join on one line (a
    clean-clone run read 5 of 6 ranks' silence lines so). One write under the pipe's atomic size is never split."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
