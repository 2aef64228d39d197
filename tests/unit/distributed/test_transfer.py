"""Tests of torchrl_post/distributed/transfer.py: balancing groups and the transfer plan."""

from __future__ import annotations

import random

import pytest
import torch

from torchrl_post.distributed.transfer import balance_groups, plan_transfer

# --- the transfer plan ----------------------------------------------------------------------------------------


def test_balance_groups_hand_example() -> None:
    # Longest first to the lightest rank with room: 9->0, 7->1, 5->1 (7<9), 1->0 (room: 0 has 1 left, 1 has 0).
    assert balance_groups([5, 9, 1, 7], 2) == [1, 0, 0, 1]


@pytest.mark.parametrize("n_dst", [1, 2, 3, 4])
def test_balance_groups_equal_counts_and_bounded_spread(n_dst: int) -> None:
    rng = random.Random(n_dst)
    tokens = [rng.randint(1, 200) for _ in range(12 * n_dst)]
    dest = balance_groups(tokens, n_dst)
    counts = [dest.count(d) for d in range(n_dst)]
    assert counts == [12] * n_dst
    loads = [sum(t for t, d in zip(tokens, dest, strict=True) if d == r) for r in range(n_dst)]
    assert max(loads) - min(loads) <= max(tokens)


def test_balance_groups_refuses_uneven_split() -> None:
    with pytest.raises(ValueError, match="evenly"):
        balance_groups([1, 2, 3], 2)


def test_plan_transfer_owner_and_dest() -> None:
    # rows: index, owner rank, tokens, version, gen ms (two engines on ranks 2 and 3)
    table = torch.tensor([[0, 2, 10, 0, 5], [1, 2, 30, 0, 5], [3, 3, 20, 0, 7], [2, 3, 40, 0, 7]])
    owner, dest = plan_transfer(table, 4, [0, 1])
    assert owner == {0: 2, 1: 2, 2: 3, 3: 3}
    # tokens by index [10, 30, 40, 20]: 40->0, 30->1, 20->1, 10->0
    assert dest == {0: 0, 1: 1, 2: 0, 3: 1}


def test_plan_transfer_detects_missing_group() -> None:
    table = torch.tensor([[0, 2, 10, 0, 5], [2, 2, 30, 0, 5]])
    with pytest.raises(RuntimeError, match="expected 0..2"):
        plan_transfer(table, 3, [0, 1])


def test_group_rows_fill_named_columns() -> None:
    from torchrl_post.distributed.transfer import ROW_SHORT, ROW_TOKENS, GroupRow, group_rows

    rows = group_rows([GroupRow(3, 1, 40, short=2), (4, 1, 50)])
    assert rows.shape == (2, len(GroupRow._fields)) and rows.dtype == torch.int64
    assert rows[:, ROW_TOKENS].tolist() == [40, 50] and rows[:, ROW_SHORT].tolist() == [2, 0]
    assert group_rows([]).shape == (0, len(GroupRow._fields))
