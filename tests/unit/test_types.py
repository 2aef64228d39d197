"""Tests of torchrl_post/types.py: the Batch contract (split/concat, wire, trimmed, masks, images); termination codes."""

from __future__ import annotations

import io
import math
from dataclasses import fields, replace

import pytest
import torch

from tests.unit.batch_helpers import PAD, _prompts, _two_prompt_batch
from tests.unit.vision_helpers import _batch
from torchrl_post.engines.batch import collate
from torchrl_post.types import TERMINATIONS, Batch, Generation, termination_codes


def _three_prompt_batch() -> Batch:
    """3 prompts x n=2 where the middle group is the widest in prompt and in response, so both the first and the
    last group need padding on both sides when joined again."""
    prompts = _prompts([[1, 2], [3, 4, 5, 6], [7]], [0, 1, 2])
    gen = Generation(
        response_ids=[[20], [21, 22], [23, 24, 25, 26, 27], [28], [], []],
        logprobs=[[-0.1], [-0.2, -0.3], [-0.4, -0.5, -0.6, -0.7, -0.8], [-0.9], [], []],
        finish_reasons=["stop", "stop", "length", "stop", "stop", "stop"],
    )
    return collate(prompts, gen, n=2, pad_id=PAD)


def _fill_optional(b: Batch) -> Batch:
    """Every optional field set, as the later stages would (per-token fields zero outside the response)."""
    n, r = len(b), b.response_width
    g = torch.Generator().manual_seed(0)
    m = b.loss_mask

    def tok() -> torch.Tensor:
        return torch.randn(n, r, generator=g) * m

    return replace(
        b,
        scores=torch.arange(n, dtype=torch.float32) / 4,
        reward_errors=torch.tensor([0.0, 1.0] * (n // 2)),
        reward_extra={"acc": torch.arange(n, dtype=torch.float32), "fmt": -torch.arange(n, dtype=torch.float32)},
        old_log_probs=tok(),
        ref_log_probs=tok(),
        values=tok(),
        advantages=tok(),
        returns=tok(),
        # a per-token field with trailing dimensions: a distillation teacher's top-k (log p, id) per position
        teacher_topk=torch.randn(n, r, 3, 2, generator=g) * m[..., None, None],
    )


def _assert_same(a: Batch, b: Batch) -> None:
    """Every field equal: same dtype, same shape, same values (NaN == NaN)."""
    for f in fields(Batch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "reward_extra":
            assert set(x) == set(y), f.name
            for k in x:
                assert x[k].dtype == y[k].dtype, (f.name, k)
                torch.testing.assert_close(x[k], y[k], rtol=0, atol=0, equal_nan=True, msg=f"reward_extra/{k}")
            continue
        if x is None or y is None:
            assert x is None and y is None, f.name
            continue
        assert x.dtype == y.dtype, (f.name, x.dtype, y.dtype)
        assert x.shape == y.shape, (f.name, x.shape, y.shape)
        assert torch.equal(x, y), f"{f.name}:\n{x}\n!=\n{y}"


# -------------------------------------------------------------------------------------- split_groups / concat


def test_split_groups_are_trimmed_per_group():
    parts = _two_prompt_batch().split_groups()
    assert list(parts) == [3, 4]
    g3, g4 = parts[3], parts[4]
    assert (g3.prompt_width, g3.response_width) == (3, 4)
    # group 4: one prompt token, longest response 1 token
    assert (g4.prompt_width, g4.response_width) == (1, 1)
    assert g4.input_ids.tolist() == [[8, 99], [8, 17]]
    assert g4.attention_mask.tolist() == [[1, 0], [1, 1]]
    assert g4.position_ids.tolist() == [[0, 0], [0, 1]]
    assert g4.loss_mask.tolist() == [[0.0], [1.0]]
    assert g4.rollout_log_probs.tolist() == [[0.0], [-0.125]]
    assert g4.group_ids.tolist() == [4, 4]


@pytest.mark.parametrize("make", [_two_prompt_batch, _three_prompt_batch], ids=["two_prompts", "three_prompts"])
@pytest.mark.parametrize("optional", [False, True], ids=["bare", "all_fields"])
def test_split_groups_then_concat_is_exact(make, optional):
    b = make()
    if optional:
        b = _fill_optional(b)
    parts = b.split_groups()
    widths = {(p.prompt_width, p.response_width) for p in parts.values()}
    assert len(widths) > 1, "the case must have groups of different widths"
    assert any(p.input_ids.shape[1] < b.input_ids.shape[1] for p in parts.values())
    _assert_same(Batch.concat(list(parts.values()), pad_id=PAD), b)


def test_concat_of_row_selections_keeps_order():
    b = _fill_optional(_three_prompt_batch())
    pieces = [b.select(slice(0, 1)), b.select(slice(1, 4)), b.select(torch.tensor([4, 5]))]
    _assert_same(Batch.concat(pieces, pad_id=PAD), b)


def test_concat_missing_reward_extra_key_is_nan():
    b = _fill_optional(_two_prompt_batch())
    parts = b.split_groups()
    first = replace(parts[3], reward_extra={"acc": parts[3].reward_extra["acc"]})  # lacks "fmt"
    second = parts[4]
    out = Batch.concat([first, second], pad_id=PAD)
    assert set(out.reward_extra) == {"acc", "fmt"}
    assert out.reward_extra["acc"].tolist() == [0.0, 1.0, 2.0, 3.0]
    fmt = out.reward_extra["fmt"].tolist()
    assert math.isnan(fmt[0]) and math.isnan(fmt[1]) and fmt[2:] == [-2.0, -3.0]
    # and the other way round: the first part has the key, a later one lacks it
    out = Batch.concat([parts[3], replace(second, reward_extra={})], pad_id=PAD)
    assert set(out.reward_extra) == {"acc", "fmt"}
    acc = out.reward_extra["acc"].tolist()
    assert acc[:2] == [0.0, 1.0] and math.isnan(acc[2]) and math.isnan(acc[3])


# ------------------------------------------------------------------------------------------------------ wire


def test_wire_round_trip_is_exact():
    for b in (_two_prompt_batch(), _fill_optional(_three_prompt_batch())):
        wire = b.to_wire()
        assert all(isinstance(v, torch.Tensor) for v in wire.values())
        _assert_same(Batch.from_wire(wire), b)


def test_wire_holds_only_tensors_and_loads_weights_only():
    b = _fill_optional(_two_prompt_batch())
    wire = b.to_wire()
    assert all(type(k) is str for k in wire)
    assert all(type(v) is torch.Tensor for v in wire.values())
    assert "reward_extra/acc" in wire and "reward_extra/fmt" in wire and "reward_extra" not in wire
    buf = io.BytesIO()
    torch.save(wire, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    _assert_same(Batch.from_wire(loaded), b)
    # optional fields that are None do not travel
    assert "scores" not in _two_prompt_batch().to_wire()


def test_from_wire_rejects_unknown_fields():
    wire = _two_prompt_batch().to_wire() | {"bogus": torch.zeros(4)}
    with pytest.raises(RuntimeError, match="bogus"):
        Batch.from_wire(wire)


# --------------------------------------------------------------------------------------------------- trimmed


def test_trimmed_drops_shared_padding_columns():
    # widen a batch: two extra all-padding prompt columns on the left, three past the longest response
    b = _fill_optional(_two_prompt_batch())
    wide = Batch.concat(
        [b, _pad_only_batch(prompt_width=b.prompt_width + 2, response_width=b.response_width + 3)], pad_id=PAD
    ).select(slice(0, len(b)))
    assert (wide.prompt_width, wide.response_width) == (5, 7)
    assert wide.input_ids[:, :2].eq(PAD).all() and wide.attention_mask[:, :2].eq(0).all()
    _assert_same(wide.trimmed(), b)
    # group 4 alone: prompt columns 0-1 and response columns 1-3 are padding in every row
    g4 = b.select(slice(2, 4)).trimmed()
    assert (g4.prompt_width, g4.response_width) == (1, 1)
    assert g4.input_ids.tolist() == [[8, 99], [8, 17]]
    assert g4.advantages.shape == (2, 1) and g4.values.shape == (2, 1)


def test_trimmed_keeps_one_response_column_when_all_empty():
    prompts = _prompts([[4, 5], [6]], [0, 1])
    gen = Generation([[], [], [], []], [[], [], [], []], ["length"] * 4)
    b = collate(prompts, gen, n=2, pad_id=PAD)
    wide = replace(
        b,
        input_ids=torch.nn.functional.pad(b.input_ids, (0, 2), value=PAD),
        attention_mask=torch.nn.functional.pad(b.attention_mask, (0, 2)),
        position_ids=torch.nn.functional.pad(b.position_ids, (0, 2)),
        loss_mask=torch.nn.functional.pad(b.loss_mask, (0, 2)),
        rollout_log_probs=torch.nn.functional.pad(b.rollout_log_probs, (0, 2)),
    )
    t = wide.trimmed()
    assert t.response_width == 1 and t.prompt_width == 2
    assert t.input_ids.tolist() == [[4, 5, 99]] * 2 + [[99, 6, 99]] * 2
    assert t.loss_mask.tolist() == [[0.0]] * 4
    # a group of the one-token prompt: its prompt shrinks to one column, one response column stays
    g1 = b.split_groups()[1]
    assert g1.input_ids.tolist() == [[6, 99], [6, 99]] and g1.response_width == 1


def _pad_only_batch(prompt_width: int, response_width: int) -> Batch:
    """One row of nothing but padding, `prompt_width + response_width` wide (with the optional fields set, so a
    concat with it keeps them)."""
    w = prompt_width + response_width
    zeros_r = torch.zeros(1, response_width)
    return Batch(
        input_ids=torch.full((1, w), PAD),
        attention_mask=torch.zeros(1, w, dtype=torch.long),
        position_ids=torch.zeros(1, w, dtype=torch.long),
        loss_mask=zeros_r,
        rollout_log_probs=zeros_r,
        group_ids=torch.tensor([100]),
        termination=torch.tensor([0]),
        weights=torch.ones(1),
        scores=torch.zeros(1),
        reward_errors=torch.zeros(1),
        reward_extra={"acc": torch.zeros(1), "fmt": torch.zeros(1)},
        old_log_probs=zeros_r,
        ref_log_probs=zeros_r,
        values=zeros_r,
        advantages=zeros_r,
        returns=zeros_r,
        teacher_topk=torch.zeros(1, response_width, 3, 2),
    )


# ---------------------------------------------------------------------------------------- masks, termination


def test_train_mask_is_loss_mask_times_weights():
    b = _two_prompt_batch()
    b = replace(b, weights=torch.tensor([1.0, 0.0, 1.0, 0.5]))
    assert torch.equal(b.train_mask, b.loss_mask * torch.tensor([[1.0], [0.0], [1.0], [0.5]]))
    assert b.train_mask[1].eq(0).all() and b.loss_mask[1].eq(1).all()  # a filtered row trains on nothing
    assert torch.equal(b.train_mask[0], b.loss_mask[0])
    assert b.train_mask[3].tolist() == [0.5, 0.0, 0.0, 0.0]
    assert torch.equal(b.response_mask, b.loss_mask)  # the response mask ignores the weights


def test_termination_codes():
    codes = termination_codes(list(TERMINATIONS))
    assert codes.dtype == torch.long and codes.tolist() == list(range(len(TERMINATIONS)))
    assert termination_codes(["length", "stop", "length"]).tolist() == [1, 0, 1]
    assert termination_codes([]).tolist() == []
    with pytest.raises(ValueError, match="bogus_reason") as err:
        termination_codes(["stop", "bogus_reason"])
    assert "'stop'" not in str(err.value).split(";")[0]  # only the unknown name is listed as unknown


# --- images -------------------------------------------------------------------------------------------------


def test_rows_keep_their_images() -> None:
    b = _batch()
    assert b.image_counts.tolist() == [1, 1, 0, 0, 1, 1]
    assert b.image_grid_thw.tolist() == [[1, 4, 2], [1, 4, 2], [1, 2, 2], [1, 2, 2]]
    assert len(b.pixel_values) == 8 + 8 + 4 + 4
    picked = b.select(torch.tensor([5, 2, 0]))
    assert picked.image_counts.tolist() == [1, 0, 1]
    assert picked.image_grid_thw.tolist() == [[1, 2, 2], [1, 4, 2]]
    assert picked.pixel_values[:, 0].tolist() == [3.0] * 4 + [1.0] * 8
    parts = b.split_groups()
    again = Batch.concat([Batch.from_wire(parts[g].to_wire()) for g in sorted(parts)], PAD)
    for name in ("input_ids", "attention_mask", "position_ids", "pixel_values", "image_grid_thw", "image_counts"):
        assert torch.equal(getattr(again, name), getattr(b, name)), name
