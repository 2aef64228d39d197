"""Tests of torchrl_post/workers/micro_batches.py: fixed, token-budget and packed plans, the same count on every rank."""

from __future__ import annotations

import torch

from tests.unit.loss_helpers import N, P, R, _case
from tests.unit.workers.helpers import RAGGED, _batch, _groups
from torchrl_post.workers.micro_batches import MicroBatch, chunks, micro_slices, plan_micro_batches, trim_span


def test_plan_micro_batches_sizes() -> None:
    b = _batch(RAGGED)
    lengths = b.attention_mask.sum(1).tolist()
    assert lengths == [12, 8, 7, 5, 5, 7]
    fixed = plan_micro_batches(b.attention_mask, b.response_width, 4, 0, packed=True)
    assert [m.rows for m in fixed] == [slice(0, 4), slice(4, 6)]
    dyn = plan_micro_batches(b.attention_mask, b.response_width, 4, 15, packed=True)
    # FFD into 15 tokens needs 4 packs (12 | 8+7 | 7+5 | 5); then 4 bins by load: 12, 8, 7, 7, then the 5s onto
    # the two 7s (the first on a tie)
    assert [m.rows.tolist() for m in dyn if isinstance(m.rows, torch.Tensor)] == [[0], [1], [2, 3], [4, 5]]
    assert all(m.live for m in dyn)
    assert sorted(i for m in dyn for i in m.rows.tolist()) == list(range(6))  # type: ignore[union-attr]


def test_stand_in_micro_batches_only_without_group() -> None:
    b = _batch(RAGGED)
    plan = plan_micro_batches(b.attention_mask, b.response_width, 99, 100, packed=False)
    assert plan == [MicroBatch(slice(0, 6))]


def test_dynamic_plan_keeps_a_prompts_samples_together() -> None:
    b = _groups([0, 3, 5], [[1, 0, 3, 4], [2, 2, 0, 1], [0, 4, 3, 1]])
    plan = plan_micro_batches(b.attention_mask, b.response_width, 99, 16, packed=True, prompts=b.input_ids)
    groups = [set(m.rows.tolist()) for m in plan]  # type: ignore[union-attr]
    assert sorted(i for g in groups for i in g) == list(range(12))
    # prompt + responses: 9 + (3+4+1+0) = 17 and 6 + (2+2+4+3) = 17 tokens do not fit 16: each split in two
    # (first rows while they fit); 4 + (4+0+1+3) = 12 goes whole
    for members, parts in (({0, 1, 2, 3}, 2), ({4, 5, 6, 7}, 2), ({8, 9, 10, 11}, 1)):
        assert sum(1 for g in groups if g & members) == parts


def test_micro_slices_with_token_budget_split_unevenly():
    _, _, _, attention = _case()
    budget = 40
    slices = micro_slices(attention, R, max_rows=N, token_budget=budget)
    assert [s.start for s in slices] == [0] + [s.stop for s in slices[:-1]] and slices[-1].stop == N
    sizes = [s.stop - s.start for s in slices]
    assert len(slices) >= 3 and len(set(sizes)) > 1, sizes
    for i, s in enumerate(slices):
        first, kept = trim_span(attention[s], R)
        width = P - first + kept
        assert sizes[i] == 1 or sizes[i] * width <= budget, (s, width)
        if s.stop < N:  # greedy: the next row would not have fit
            first, kept = trim_span(attention[s.start : s.stop + 1], R)
            assert (sizes[i] + 1) * (P - first + kept) > budget
    # without a budget: chunks of max_rows
    assert micro_slices(attention, R, max_rows=5, token_budget=0) == [slice(0, 5), slice(5, 10), slice(10, 12)]
    assert list(chunks(12, 5)) == [slice(0, 5), slice(5, 10), slice(10, 12)]


def test_micro_slices_hand_example():
    """Rows x trimmed width may reach the budget exactly; an empty response still counts one column."""
    full = torch.ones(5, 4, dtype=torch.long)  # P = 2, R = 2, every row 4 wide
    assert micro_slices(full, 2, max_rows=99, token_budget=8) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_slices(full, 2, max_rows=99, token_budget=3) == [slice(i, i + 1) for i in range(5)]  # >= 1 row
    short = torch.tensor([[0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1]])  # widths 2, 2, 2, 4
    assert micro_slices(short, 2, max_rows=99, token_budget=6) == [slice(0, 3), slice(3, 4)]
    empty = torch.tensor([[0, 1, 0, 0]] * 3)  # the forward keeps one response column: 2 wide each
    assert micro_slices(empty, 2, max_rows=99, token_budget=3) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    assert micro_slices(empty, 2, max_rows=99, token_budget=4) == [slice(0, 2), slice(2, 3)]
