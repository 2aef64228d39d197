"""Ulysses sequence parallelism on gloo (workers/ulysses.py, distributed/ulysses.py): on 2 and 4 ranks, a tiny
Qwen2's per-token log-probs, entropies, loss and parameter gradients equal the same model's run whole, for
padded, causal, packed and shared-prompt rows, with gradient checkpointing and eager attention, with kv heads
that split over the ranks and kv heads that must be repeated first; the exchanges exact in float32 and bf16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, torchrun

pytestmark = pytest.mark.distributed

CASES = (
    "padded",
    "causal",
    "packed",
    "shared",
    "padded_checkpointed",
    "packed_checkpointed",
    "padded_eager",
    "shared_eager",
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """kv heads -> a tiny Qwen2 with 4 attention heads (head_dim 32), 2 layers."""
    from torchrl_post.demo.build import build_tiny_model

    out = {}
    for kv in (2, 1):
        out[kv] = tmp_path_factory.mktemp(f"ulysses_kv{kv}")
        build_tiny_model(out[kv], hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=kv, intermediate_size=256)
    return out


@pytest.mark.parametrize(("sp", "kvs"), [(2, (2, 1)), (4, (2, 1))])
def test_sharded_model_equals_whole_model(
    sp: int, kvs: tuple[int, ...], models: dict[int, Path], tmp_path: Path
) -> None:
    # sp=2: 2 kv heads split one per rank, 1 kv head is repeated to 2; sp=4: 2 and 1 kv heads are repeated to 4
    out = tmp_path / "report.json"
    assert_ok(torchrun(sp, ["tests/distributed/ulysses_worker.py", str(out), *(str(models[kv]) for kv in kvs)]))
    report = json.loads(out.read_text())
    assert report["sp"] == sp
    if sp == 4 and report["device"] == "cpu":  # the reward model sharded over 4 ranks scores as transformers' forward
        assert report["rm_sharded_4"] and report["rm_max_diff_4"] < 1e-6
    for dtype in ("float32", "bfloat16"):
        for check in ("seq_to_heads_exact", "heads_to_seq_exact", "backward_exact"):
            assert report[f"{check}_{dtype}"], f"{check} {dtype}"
    for kv in kvs:
        # with gradient checkpointing the backward belongs inside the block; outside it fails, loudly
        assert report[f"kv{kv}_backward_after_block"] == "no error"
        for case in CASES:
            r = report[f"kv{kv}_{case}"]
            where = f"kv{kv} {case} sp={sp}"
            # the rows' 13 columns padded to a multiple of sp; the targets spread over the ranks
            assert sum(r["targets_per_rank"]) == r["targets"] > 10, where
            assert sum(n > 0 for n in r["targets_per_rank"]) >= 2, where
            assert r["logp_finite"] and r["restored"], where
            assert r["masks_built"] == [1, 0], f"{where}: transformers built a mask for the shard"
            # measured on 2 and 4 ranks (float32, 2 CPU cores; sp=2 is bitwise equal in the forward): log p
            # within 5e-7 (log p ~ -5), entropy within 2e-6 (~4.8), the loss within 1.1e-7 relative; the mean
            # gradient over the ranks within 1.8e-6 of each tensor's largest entry (3.8e-6 absolute, gradient
            # norms 99-210): the same sums in another order.
            assert r["logp_abs"] < 2e-6, where
            assert r["entropy_abs"] < 5e-6, where
            assert r["loss_rel"] < 1e-6, where
            assert r["grad_rel"] < 1e-5, where
            assert r["grad_norm"] > 1.0, where
