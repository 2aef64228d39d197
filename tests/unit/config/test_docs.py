"""Tests of torchrl_post/config/docs.py: docs/config.md is current and documents every key."""

from __future__ import annotations

from torchrl_post.config.docs import OUT, render


def test_config_reference_is_current_and_complete() -> None:
    assert OUT.read_text() == render(), "docs/config.md is out of date: run python -m torchrl_post.config.docs"
    keys = [line for line in OUT.read_text().splitlines() if line.startswith("| `")]
    undocumented = [line.split("|")[1].strip() for line in keys if line.rstrip().endswith("|  |")]
    assert not undocumented, f"config keys without a docstring in schema.py: {undocumented}"
