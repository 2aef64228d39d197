"""Tests of torchrl_post/logging/metric_names.py: docs/metrics.md is current, and every metric name the package
writes (each literal in its source, each key of the demo's golden run) is documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

from torchrl_post.logging.metric_names import OUT, documented, render

PACKAGE = Path(__file__).resolve().parents[3] / "torchrl_post"
GOLDEN = Path(__file__).resolve().parents[2] / "e2e" / "golden" / "demo_20_steps.jsonl"
SECTIONS = (
    "actor|critic|rollout|rollout_corr|perf|timing_s|training|val|filter|reward|response_length|prompt_length|agent"
)
NAME = re.compile(rf"""f?["']((?:{SECTIONS})/[A-Za-z0-9_@/{{}}.-]+)["']""")


def test_metrics_reference_is_current() -> None:
    assert OUT.read_text() == render(), (
        "docs/metrics.md is out of date: run python -m torchrl_post.logging.metric_names"
    )


def test_every_metric_in_the_source_is_documented() -> None:
    names = {
        m
        for path in PACKAGE.rglob("*.py")
        if path.name != "metric_names.py"
        for m in NAME.findall(path.read_text())
        if not m.endswith("/")  # a prefix (startswith checks), not a name
    }
    assert len(names) > 40
    missing = sorted(n for n in names if not documented(n))
    assert not missing, f"add these to torchrl_post/logging/metric_names.py: {missing}"


def test_every_metric_of_the_golden_run_is_documented() -> None:
    keys = {k for line in GOLDEN.read_text().splitlines() for k in json.loads(line)}
    assert "critic/score/mean" in keys
    assert not sorted(k for k in keys if not documented(k))


def test_patterns_match_filled_names_only() -> None:
    assert documented("val/test_score/openai/gsm8k/pass@4") and documented("timing_s/update_actor")
    assert documented("filter/{reason}") and documented("reward/format")
    assert not documented("actor/made_up") and not documented("critic/score/median")
