"""The MoE routing benchmark's report (benchmarks/moe_routing.py) from a record, without running anything."""

from __future__ import annotations

from pathlib import Path

from benchmarks import moe_routing


def test_report_compares_each_setting_with_the_dense_model(tmp_path: Path) -> None:
    def run(mode: str, diff: float, mismatch: float | None) -> dict[str, object]:
        per_step = {"logprob_diff": [diff, diff], "router_mismatch": [mismatch, mismatch]}
        label = moe_routing.MODES[mode][0]
        return {"mode": mode, "label": label, "logprob_diff": diff, "router_mismatch": mismatch, "per_step": per_step}

    rec = {
        "machine": {"cpu_count": 2, "torch": "t", "vllm": "v"}, "steps": 2,
        "runs": [
            run("dense", 4e-3, None), run("moe", 6e-3, 0.02), run("moe_replay", 4e-3, 0.02),
            run("moe_fp32", 1e-7, 0.0), run("ties", 8e-3, 0.05), run("ties_replay", 4e-3, 0.05),
        ],
    }  # fmt: skip
    md = moe_routing.markdown(rec)
    assert "| MoE, engine bf16, no replay | 0.0200 | 6.00e-03 | 1.50x |" in md
    assert "| dense demo model, engine bf16 | n/a | 4.00e-03 | 1.00x |" in md
    assert "disagree on 2.00% of the routing decisions" in md and "replaying the engine's experts gives 4.00e-03" in md
    assert "5.00% of the decisions" in md and "8.00e-03 without replay and 4.00e-03 with it" in md
    moe_routing.plot(tmp_path / "p.png", rec)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
