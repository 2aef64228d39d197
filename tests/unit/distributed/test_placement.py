"""Tests of torchrl_post/distributed/placement.py: role placement, cells and the sync group (no process group)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.error_helpers import _one_line
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import PlacementConfig
from torchrl_post.distributed.placement import plan_placement

# --- plan_placement -----------------------------------------------------------------------------------------


def _placement_error(world_size: int, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        plan_placement(PlacementConfig(**kw), world_size)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_default_placement_is_colocated_on_all_ranks():
    p = plan_placement(PlacementConfig(), 2)
    assert p.world_size == 2
    assert p.ranks == {"actor": [0, 1], "rollout": [0, 1]}
    assert p.colocated == {"actor": True, "rollout": True}
    assert p.fully_colocated()
    assert not p.has("critic") and not p.has("reference")


def test_disaggregated_placement():
    p = plan_placement(PlacementConfig(actor=[1, 0], rollout=[3, 2]), 4)
    assert p.ranks == {"actor": [0, 1], "rollout": [2, 3]}
    assert p.colocated["rollout"] is False
    assert not p.fully_colocated()


def test_placement_rank_out_of_range():
    msg = _placement_error(2, actor=[0, 2])
    assert "placement.actor" in msg


def test_placement_duplicate_rank():
    msg = _placement_error(2, actor=[0, 0, 1])
    assert "placement.actor" in msg


def test_placement_partial_overlap_with_actor():
    msg = _placement_error(3, actor=[0, 1], rollout=[1, 2])
    assert "placement.rollout" in msg


def test_placement_ranks_without_role():
    msg = _placement_error(4, actor=[0, 1], rollout="actor")
    assert "[2, 3]" in msg


def test_placement_rollout_null():
    msg = _placement_error(2, rollout=None)
    assert "placement.rollout" in msg


# --- placement ranks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [[2, "x"], [0.5], [True], [1, None]])
def test_non_integer_rank(ranks: list[Any]) -> None:
    with pytest.raises(ConfigError) as info:
        plan_placement(PlacementConfig(actor=[0, 1], rollout=ranks), 4)
    msg = _one_line(info)
    assert msg.startswith("placement.rollout=") and f"rank {ranks[-1]!r} is not an integer" in msg


# --- cells and the sync group ---------------------------------------------------------------------------------


def test_cells_and_sync_group_for_three_and_four_ranks() -> None:
    p3 = plan_placement(PlacementConfig(actor=[0, 1], rollout=[2]), 3)
    assert p3.cells() == {"actor": [0, 1], "rollout": [2]}
    assert p3.sync_ranks() == [0, 2]
    assert [p3.cell_of(r) for r in range(3)] == ["actor", "actor", "rollout"]
    p4 = plan_placement(PlacementConfig(actor=[0, 1], rollout=[2, 3]), 4)
    assert p4.sync_ranks() == [0, 2, 3]
    assert p4.roles_of(3) == ["rollout"]


def test_colocated_is_one_cell_without_sync_group() -> None:
    p = plan_placement(PlacementConfig(reference="actor"), 2)
    assert p.cells() == {"actor": [0, 1]}
    assert p.sync_ranks() == []
    assert p.roles_of(1) == ["actor", "rollout", "reference"]


def test_critic_on_its_own_ranks_is_its_own_cell() -> None:
    p = plan_placement(PlacementConfig(actor=[0, 1], rollout=[2], critic=[3]), 4)
    assert p.cells() == {"actor": [0, 1], "rollout": [2], "critic": [3]}
