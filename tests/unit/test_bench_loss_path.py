"""The loss-path benchmark's arithmetic (benchmarks/loss_path.py): the slope fit, the memory guard of the
full-logits path, and the report from a record, without measuring anything.

    .venv/bin/pytest -q tests/unit/test_bench_loss_path.py
"""

from __future__ import annotations

import pytest

from benchmarks import common, loss_path


def test_fit_recovers_a_line() -> None:
    f = common.fit([(256, 1000 + 256 * 300), (1024, 1000 + 1024 * 300), (4096, 1000 + 4096 * 300)])
    assert f is not None and f["points"] == 3
    assert f["slope_bytes_per_token"] == pytest.approx(300) and f["intercept_bytes"] == pytest.approx(1000)
    assert common.fit([(256, 1)]) is None


def test_full_logits_guard_keeps_half_of_free_memory() -> None:
    vocab, lengths = 151936, (256, 512, 1024, 2048, 4096)
    per_token = loss_path.FULL_LOGITS_COPIES * vocab * 4
    assert loss_path.full_logits_limit(vocab, lengths, 2 * 4096 * per_token) == 0  # everything fits
    assert loss_path.full_logits_limit(vocab, lengths, 2 * 2048 * per_token) == 2048
    assert loss_path.full_logits_limit(vocab, lengths, 1) == 256  # the shortest always runs


def test_markdown_sets_the_slopes_beside_hidden_and_vocabulary() -> None:
    def path(label: str, chunk: int, slope: float) -> dict:
        results = [{"response_len": n, "tokens": n, "peak_bytes": int(1e8 + slope * n)} for n in (1024, 2048)]
        fit = common.fit([(r["tokens"], r["peak_bytes"]) for r in results])
        return {"label": label, "results": results, "fit": fit, "fit_from_tokens": chunk}

    rec = {
        "machine": {}, "vocab_size": 151936, "hidden_size": 64, "num_layers": 2, "chunk": 1024, "loadavg_1m": 1.0,
        "hidden_bytes_per_token": 256, "vocab_bytes_per_token": 151936 * 4, "full_logits_skipped_above": 0,
        "rows": [{"response_len": 1024, "before_mib": 3000.0, "after_mib": 700.0, "ratio": 4.3}],
        "paths": [path("before", 0, 5 * 151936 * 4), path("after", 1024, 40 * 256)],
    }  # fmt: skip
    md = loss_path.markdown(rec)
    assert "| 1024 | 3000 | 700 | 4.3x |" in md
    assert "| before: full logits (HEAD_CHUNK_TOKENS=0) | 3,038,720 | 11870.0 | 5.000 |" in md
    assert "40 x hidden x 4 bytes" in md and "follows the hidden size, not the vocabulary" in md
