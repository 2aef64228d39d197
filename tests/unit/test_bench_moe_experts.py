"""The MoE experts benchmark's arithmetic and report (benchmarks/moe_experts.py): what batched_mm would gather,
and the table from a record, without measuring anything.

    .venv/bin/pytest -q tests/unit/test_bench_moe_experts.py
"""

from __future__ import annotations

from benchmarks import moe_experts


def test_batched_mm_gathers_each_routed_tokens_expert_weights() -> None:
    tiny, larger = moe_experts.SIZES
    # 4 layers x 2048 tokens x top-2 x (gate_up 1024 x 512 + down 512 x 512) float32 elements
    assert moe_experts.batched_mm_bytes(larger, 8 * 256, 4) == 4 * 2048 * 2 * 3 * 512 * 512 * 4 == 48 * 2**30
    assert moe_experts.batched_mm_bytes(tiny, 8 * 256, 2) == 2 * 2048 * 2 * 3 * 64 * 64 * 2


def test_markdown_flags_skips_and_disagreements() -> None:
    def row(impl: str, **kw: object) -> dict[str, object]:
        return {"size": "larger", "dtype": "float32", "implementation": impl, **kw}

    rec = {
        "machine": {"cpu_count": 2}, "sizes": [vars(moe_experts.SIZES[1])], "batch": 8, "seq": 256, "threads": 1,
        "warmup": 2, "repeats": 9, "loadavg_1m": 1.0,
        "rows": [
            row("eager", ms=900.0, wall_ms=1880.0),
            row("grouped_mm", ms=300.0, wall_ms=590.0, speedup=3.0, wall_speedup=3.19, loss_diff=0.0, grad_diff=2e-5,
                agrees=False),
            row("batched_mm", skipped="would gather 48 GiB of expert weights"),
        ],
    }  # fmt: skip
    md = moe_experts.markdown(rec)
    assert "| larger | float32 | grouped_mm | 300.0 | 590.0 | 3.00x | 3.19x | 0.0e+00 | 2.0e-05 | DISAGREES" in md
    assert "| larger | float32 | batched_mm |  |  |  |  |  |  | would gather 48 GiB of expert weights |" in md
