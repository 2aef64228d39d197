"""`reduce_metrics` on one process: without a process group (and in a world of one) every op returns the local
value (`mean` divides by a size of 1); an unknown op is a ValueError. Multi-rank reduction is tested elsewhere."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from torchrl_post.logging.reduce import REDUCE_OPS, reduce_metrics

LOCAL = {
    "tokens": ("sum", 120.0),
    "response_length/max": ("max", 7.0),
    "response_length/min": ("min", -2.5),
    "score/mean": ("mean", 0.375),
    "count": ("sum", 3),  # an int comes back as a float
}
EXPECTED = {"tokens": 120.0, "response_length/max": 7.0, "response_length/min": -2.5, "score/mean": 0.375, "count": 3.0}


def test_no_process_group_returns_local_values():
    assert not (dist.is_available() and dist.is_initialized())
    out = reduce_metrics(LOCAL)
    assert out == EXPECTED
    assert all(type(v) is float for v in out.values())


def test_each_op_alone_and_empty():
    for op in REDUCE_OPS:
        assert reduce_metrics({"x": (op, 1.25)}) == {"x": 1.25}
    assert reduce_metrics({}) == {}


def test_unknown_op_raises():
    with pytest.raises(ValueError, match="avg"):
        reduce_metrics({"a": ("sum", 1.0), "b": ("avg", 2.0)})


def test_world_of_one_returns_local_values(tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert reduce_metrics(LOCAL) == EXPECTED
        assert reduce_metrics(LOCAL, group=dist.new_group([0])) == EXPECTED
    finally:
        dist.destroy_process_group()
