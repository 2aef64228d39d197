"""Expert-parallel benchmark: what actor.fsdp.expert_parallel_size changes per rank, on 4 ranks.

benchmarks/expert_parallel_worker.py under torchrun for ep = 1, 2, 4: a Qwen3-MoE (16 experts, top-2, hidden 256,
4 layers; 8 experts and 2 layers with --quick/--tiny) wrapped by the trainer's own `apply_fsdp`, float32 on gloo, one
1024-token row per rank per update. Per rank: the expert bytes one layer's forward gathers (and gathered x ep / a
layer's expert bytes, goal 1.0), the parameters and AdamW state kept, the update time and the all-to-alls' share of a
profiled update. A bespoke worker: the trainer reports neither the gathered expert bytes nor the all-to-all's time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "expert_parallel"
WORKER = Path(__file__).resolve().parent / "expert_parallel_worker.py"
RANKS = 4
EPS = (1, 2, 4)


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = {"experts": 8, "layers": 2, "repeats": 1} if args.quick or args.tiny else {}
    rows = []
    for ep in EPS:
        rec = common.run_worker(f"{NAME}_ep{ep}", WORKER, RANKS, {"ep": ep, **shape})
        ranks = rec["ranks"]
        gathered = max(r["expert_bytes_gathered"] for r in ranks)
        rows.append({
            "ep": ep, "experts": rec["experts"], "gathered_mib": gathered / 2**20,
            "ratio": gathered * ep / ranks[0]["expert_bytes_per_layer"],
            "kept_mib": max(r["params_and_optimizer_bytes"] for r in ranks) / 2**20,
            "update_s": statistics.median(r["update_s"] for r in ranks),
            "all_to_all_share": statistics.median(r["all_to_all_share"] for r in ranks), "loadavg_1m": rec["loadavg_1m"],
        })  # fmt: skip
        print(f"ep {ep}: {rows[-1]}", flush=True)
    return {"ranks": RANKS, "rows": rows}


COLUMNS = [
    ("ep", "ep", "{}"), ("experts", "experts", "{}"), ("expert MiB gathered / layer / rank", "gathered_mib", "{:.2f}"),
    ("gathered x ep / layer's experts", "ratio", "{:.3f}"), ("params + AdamW MiB / rank", "kept_mib", "{:.1f}"),
    ("update s", "update_s", "{:.3f}"), ("all-to-all share", "all_to_all_share", "{:.1%}"),
]  # fmt: skip


def markdown(rec: dict[str, Any]) -> str:
    rows = {r["ep"]: r for r in rec["rows"]}
    top = rows[max(rows)]
    return common.blocks(
        "## Expert parallelism",
        f"{rec['ranks']} ranks, float32, gloo.",
        common.table(rec["rows"], COLUMNS),
        f"At ep = {top['ep']} a rank gathers {top['gathered_mib']:.2f} MiB of a layer's experts against "
        f"{rows[1]['gathered_mib']:.2f} MiB at ep = 1 (gathered x ep / all = {top['ratio']:.3f}); the parameters and "
        "AdamW state it keeps do not change (the experts are sharded over every rank either way). The all-to-alls "
        f"take {top['all_to_all_share']:.0%} of its update: {rec['ranks']} ranks on shared CPUs over gloo, the share "
        "counts the wait for the slowest rank.",
    )


def plot(path: Path, rec: dict[str, Any]) -> None:
    rows = rec["rows"]
    fig, (left, right) = common.subplots(1, 2, figsize=(9, 3.5))
    eps = [str(r["ep"]) for r in rows]
    left.bar(eps, [r["gathered_mib"] for r in rows])
    left.set(xlabel="expert_parallel_size", ylabel="MiB", title="experts gathered per layer per rank")
    right.bar(eps, [r["update_s"] for r in rows], label="update")
    right.bar(eps, [r["update_s"] * r["all_to_all_share"] for r in rows], label="all-to-all")
    right.set(xlabel="expert_parallel_size", ylabel="s", title="one update")
    right.legend()
    common.save_figure(fig, path)


if __name__ == "__main__":
    common.standalone(sys.modules[__name__])
