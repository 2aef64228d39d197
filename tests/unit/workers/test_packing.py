"""Tests of torchrl_post/workers/packing.py: first-fit rows, pack layouts, shared prompts."""

from __future__ import annotations

from tests.unit.workers.helpers import CPU, RAGGED, _batch, _groups
from torchrl_post.workers.packing import balance_rows, pack, pack_rows, share_prompts


def test_pack_rows_first_fit_decreasing() -> None:
    # lengths 7, 3, 5, 2, 9 into budget 10: 9 | 7+3 | 5+2 (longest first, each into the first pack it fits)
    assert pack_rows([7, 3, 5, 2, 9], 10) == [[4], [0, 1], [2, 3]]
    assert pack_rows([12, 1], 10) == [[0], [1]]  # a row over the budget goes alone


def test_balance_rows_into_exactly_k_bins() -> None:
    # longest first into the lightest bin (the first on a tie): 9 -> b0, 7 -> b1, 5 -> b1 (7 < 9, now 12),
    # 3 -> b0 (9 < 12, now 12), 2 -> b0 (tie, now 14)
    assert balance_rows([7, 3, 5, 2, 9], 2) == [[1, 3, 4], [0, 2]]
    assert balance_rows([4, 4], 3) == [[0], [1], []]  # fewer rows than bins: an empty bin


def test_pack_layout_by_hand() -> None:
    # sample 0: 2 prompt + 2 response tokens (length 4); sample 1: 1 + 1 (length 2). Rows are as long as the
    # longest sample (4) and right-aligned: row 1 starts with 2 slack cells whose positions (1, 2) the sample's
    # restart at 0 cuts off.
    b = _batch([(5, 3), (6, 4)], prompt=7, resp=5, seed=1)
    p = pack(b, slice(0, 2))
    assert (p.tokens, p.cells) == (6, 8)
    assert p.pos.tolist() == [[0, 1, 2, 3], [1, 2, 0, 1]]
    assert p.ids[0].tolist() == b.input_ids[0, 5:9].tolist() and p.ids[1, 2:].tolist() == b.input_ids[1, 6:8].tolist()
    # response tokens: sample 0 at row 0 columns 2, 3 (predicted from 1, 2), sample 1 at row 1 column 3 (from 2):
    # the LM head runs on columns 1 and 2 only
    assert p.out_row.tolist() == [0, 0, 1] and p.out_col.tolist() == [1, 2, 2]
    assert p.keep.tolist() == [1, 2] and p.out_kept.tolist() == [0, 1, 1]
    assert p.labels.tolist() == [b.input_ids[0, 7].item(), b.input_ids[0, 8].item(), b.input_ids[1, 7].item()]
    assert p.valid_bt.tolist() == [[True, True, False, False, False], [True, False, False, False, False]]


def test_pack_rows_hold_several_samples() -> None:
    b = _batch(RAGGED)  # lengths 12, 8, 7, 5, 5, 7: rows of 12 hold 12 | 8 (+ nothing of 7) ...
    p = pack(b, slice(0, len(b)))
    assert p.ids.shape[1] == 12 and p.tokens == 44
    assert p.cells == 12 * len(pack_rows([12, 8, 7, 5, 5, 7], 12)) == 48 < b.attention_mask.numel()


def test_share_prompts_grows_while_attention_costs_no_more() -> None:
    # prompt 6, responses 2, 2, 1: the rows they replace are at most 8 long. 6+2 = 8 (8^2 <= 1 x 64), 10
    # (100 <= 2 x 64), 11 (121 <= 3 x 64): one segment, longest response first
    assert share_prompts([6, 6, 6], [2, 2, 1], ["a", "a", "a"], 8) == [[0, 1, 2]]
    # prompt 2, responses 6, 6: 8, then 14 (196 > 2 x 64): apart; other prompts never share
    assert share_prompts([2, 2], [6, 6], ["a", "a"], 8) == [[0], [1]]
    assert share_prompts([6, 6], [2, 2], ["a", "b"], 8) == [[0], [1]]


def test_shared_pack_layout_by_hand() -> None:
    # one prompt of 3 tokens (left pad 6 of 9), responses of 2 and 1 tokens: one segment [p p p r r s]
    b = _groups([6], [[2, 3]])
    p = pack(b, slice(0, 2), shared=True)
    assert (p.tokens, p.cells) == (6, 6)  # 3 + 2 and 3 + 1 tokens, the prompt stored once
    prompt, r0, r1 = b.input_ids[0, 6:9].tolist(), b.input_ids[0, 9:11].tolist(), b.input_ids[1, 9:10].tolist()
    assert p.ids[0].tolist() == prompt + r1 + r0  # the longest response ends the row
    assert p.pos[0].tolist() == [0, 1, 2, 3, 3, 4]
    assert p.branch is not None and p.branch[0].tolist() == [0, 0, 0, 1, 2, 2]
    # both first tokens are predicted at the prompt's end (column 2); sample 0's second token at column 4
    assert p.out_row.tolist() == [0, 0, 0] and p.out_col.tolist() == [2, 4, 2]
    assert p.labels.tolist() == r0 + r1
    allowed = p.attention(CPU)[0, 0].int().tolist()
    assert allowed[3] == [1, 1, 1, 1, 0, 0]  # sample 1's token: the prompt and itself
    assert allowed[5] == [1, 1, 1, 0, 1, 1]  # sample 0's second token: the prompt and its own branch
