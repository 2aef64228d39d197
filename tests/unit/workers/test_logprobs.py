"""Tests of torchrl_post/workers/logprobs.py: micro-batch plans, packing and shared prompts vs the padded forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.unit.loss_helpers import N, P, R, _case
from torchrl_post.types import Batch
from torchrl_post.workers.logprobs import (
    MicroBatch,
    balance_rows,
    chunks,
    micro_slices,
    pack,
    pack_rows,
    packed_forward_log_probs,
    padded_forward_log_probs,
    plan_micro_batches,
    share_prompts,
    trim_span,
)

CPU = torch.device("cpu")


def test_pack_rows_first_fit_decreasing() -> None:
    # lengths 7, 3, 5, 2, 9 into budget 10: 9 | 7+3 | 5+2 (longest first, each into the first pack it fits)
    assert pack_rows([7, 3, 5, 2, 9], 10) == [[4], [0, 1], [2, 3]]
    assert pack_rows([12, 1], 10) == [[0], [1]]  # a row over the budget goes alone


def test_balance_rows_into_exactly_k_bins() -> None:
    # longest first into the lightest bin (the first on a tie): 9 -> b0, 7 -> b1, 5 -> b1 (7 < 9, now 12),
    # 3 -> b0 (9 < 12, now 12), 2 -> b0 (tie, now 14)
    assert balance_rows([7, 3, 5, 2, 9], 2) == [[1, 3, 4], [0, 2]]
    assert balance_rows([4, 4], 3) == [[0], [1], []]  # fewer rows than bins: an empty bin


def _batch(rows: list[tuple[int, int]], prompt: int = 7, resp: int = 5, seed: int = 0) -> Batch:
    """Rows with (left prompt padding, right response padding) as given."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (len(rows), prompt + resp), generator=gen)
    attn = torch.ones_like(ids)
    for i, (lp, lr) in enumerate(rows):
        attn[i, :lp] = 0
        if lr:
            attn[i, prompt + resp - lr :] = 0
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        loss_mask=attn[:, prompt:].float(),
        rollout_log_probs=torch.zeros(len(rows), resp),
        group_ids=torch.arange(len(rows)),
        termination=torch.zeros(len(rows), dtype=torch.long),
        weights=torch.ones(len(rows)),
    )


RAGGED = [(0, 0), (3, 1), (1, 4), (5, 2), (2, 5), (0, 5)]  # the last two: empty responses


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


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_forward_equals_padded(model: torch.nn.Module, temperature: float) -> None:
    b = _batch(RAGGED)
    mask = b.loss_mask
    rows = slice(0, len(b))
    logp_a, ent_a, cells, _ = padded_forward_log_probs(model, b, rows, temperature, CPU)
    logp_b, ent_b, packed_cells, placed = packed_forward_log_probs(model, b, rows, temperature, CPU)
    assert placed == int(b.attention_mask.sum())  # every token placed once: no prompt shared
    assert int(b.attention_mask.sum()) <= packed_cells < cells  # less padding computed
    assert ((logp_a - logp_b) * mask).abs().max() < 2e-6
    assert ((ent_a - ent_b) * mask).abs().max() < 5e-6
    assert (logp_b * (1 - mask)).abs().max() == 0  # nothing outside the responses
    # the same gradients: a loss over the response tokens
    grads = []
    for logp in (padded_forward_log_probs, packed_forward_log_probs):
        model.zero_grad()
        (logp(model, b, rows, temperature, CPU)[0] * mask * torch.arange(1.0, 6.0)).sum().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    scale = max(g.abs().max().item() for g in grads[0].values())
    assert max((grads[0][k] - grads[1][k]).abs().max().item() for k in grads[0]) < 1e-6 * max(scale, 1.0)


def test_packed_samples_do_not_attend_across(model: torch.nn.Module) -> None:
    """A sample's logprobs are the same packed beside any other sample as packed alone."""
    b = _batch(RAGGED)
    alone = packed_forward_log_probs(model, b, torch.tensor([2]), 1.0, CPU)[0]
    for other in (0, 1, 3):
        both = packed_forward_log_probs(model, b, torch.tensor([other, 2]), 1.0, CPU)[0]
        assert (both[1] - alone[0]).abs().max() < 2e-6


def test_pack_with_no_response_tokens_keeps_a_graph(model: torch.nn.Module) -> None:
    b = _batch([(2, 5), (0, 5)])
    logp, ent, _, _ = packed_forward_log_probs(model, b, slice(0, 2), 1.0, CPU)
    assert logp.abs().sum() == 0 and logp.requires_grad
    logp.sum().backward()  # a stand-in micro-batch must still run backward (FSDP's reduce-scatter)


def test_stand_in_micro_batches_only_without_group() -> None:
    b = _batch(RAGGED)
    plan = plan_micro_batches(b.attention_mask, b.response_width, 99, 100, packed=False)
    assert plan == [MicroBatch(slice(0, 6))]


# ---- shared prompts (model.use_shared_prefix) ------------------------------------------------------------------


def _groups(prompt_pads: list[int], resp_pads: list[list[int]], prompt: int = 9, resp: int = 4) -> Batch:
    """GRPO-like rows: group g's samples share one prompt (left padding `prompt_pads[g]`), their responses
    right-padded by `resp_pads[g]`."""
    rows = [(lp, lr) for lp, pads in zip(prompt_pads, resp_pads, strict=True) for lr in pads]
    b = _batch(rows, prompt=prompt, resp=resp, seed=3)
    start = 0
    for pads in resp_pads:
        b.input_ids[start : start + len(pads), :prompt] = b.input_ids[start, :prompt]
        start += len(pads)
    return b


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


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_shared_prefix_forward_equals_padded(tiny_model: Path, impl: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation=impl)
    b = _groups([0, 3, 5], [[1, 0, 3, 4], [2, 2, 0, 1], [0, 4, 3, 1]])  # the last group: an empty response
    mask, rows = b.loss_mask, slice(0, len(b))
    weights = torch.arange(1.0, 5.0)
    results = []
    for forward, kwargs in ((padded_forward_log_probs, {}), (packed_forward_log_probs, {"shared": True})):
        model.zero_grad()
        logp, ent, cells, _ = forward(model, b, rows, 1.0, CPU, **kwargs)
        (logp * mask * weights).sum().backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent, cells, grads))
    (la, ea, ca, ga), (lb, eb, cb, gb) = results
    flat = packed_forward_log_probs(model, b, rows, 1.0, CPU)[2]
    assert cb < flat < ca  # each group's prompt computed once: fewer cells than packing the samples apart
    assert ((la - lb) * mask).abs().max() < 2e-6 and ((ea - eb) * mask).abs().max() < 5e-6
    assert (lb * (1 - mask)).abs().max() == 0
    scale = max(g.abs().max().item() for g in ga.values())
    assert ga.keys() == gb.keys() and max((ga[k] - gb[k]).abs().max().item() for k in ga) < 1e-6 * max(scale, 1.0)


def test_dynamic_plan_keeps_a_prompts_samples_together() -> None:
    b = _groups([0, 3, 5], [[1, 0, 3, 4], [2, 2, 0, 1], [0, 4, 3, 1]])
    plan = plan_micro_batches(b.attention_mask, b.response_width, 99, 16, packed=True, prompts=b.input_ids)
    groups = [set(m.rows.tolist()) for m in plan]  # type: ignore[union-attr]
    assert sorted(i for g in groups for i in g) == list(range(12))
    # prompt + responses: 9 + (3+4+1+0) = 17 and 6 + (2+2+4+3) = 17 tokens do not fit 16: each split in two
    # (first rows while they fit); 4 + (4+0+1+3) = 12 goes whole
    for members, parts in (({0, 1, 2, 3}, 2), ({4, 5, 6, 7}, 2), ({8, 9, 10, 11}, 1)):
        assert sum(1 for g in groups if g & members) == parts


# --- micro_slices -------------------------------------------------------------------------------------------


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
