"""Tests of torchrl_post/workers/ulysses.py without a process group: the shard arithmetic, the global mask (by hand
and against transformers' own), one rank as the identity, and the errors. Several ranks: tests/distributed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.masking_utils import create_causal_mask

from tests.unit.workers.helpers import CPU, _batch
from torchrl_post.multimodal.vision import model_inputs
from torchrl_post.workers.packing import pack
from torchrl_post.workers.ulysses import (
    SequenceShard,
    global_attention_mask,
    pad_positions,
    sequence_parallel,
    ulysses_attention_forward,
)

T, F = True, False


def test_shard_arithmetic() -> None:
    shards = [SequenceShard(None, r, 3) for r in range(3)]
    assert [shards[0].pad_to(n) for n in (0, 1, 3, 7, 9)] == [0, 3, 3, 9, 9]
    assert [s.span(7) for s in shards] == [(0, 3), (3, 6), (6, 9)]
    x = torch.arange(14).view(2, 7)
    parts = [s.local(x, 1, value=-1) for s in shards]
    assert parts[2].tolist() == [[6, -1, -1], [13, -1, -1]]
    assert torch.equal(torch.cat(parts, 1), torch.cat([x, torch.full((2, 2), -1)], 1))  # the padded rows, in order
    assert [s.local(torch.arange(6), 0).tolist() for s in shards] == [[0, 1], [2, 3], [4, 5]]  # no padding needed
    one = SequenceShard.of(None)
    assert (one.rank, one.size, one.pad_to(7), one.span(7)) == (0, 1, 7, (0, 7))
    assert one.local(x, 1) is x


def test_pad_positions_go_on_by_one() -> None:
    pos = torch.tensor([[0, 1, 2], [3, 0, 1]])
    assert pad_positions(pos, 5).tolist() == [[0, 1, 2, 3, 4], [3, 0, 1, 2, 3]]
    assert torch.equal(pad_positions(pos, 3), pos)


def test_global_mask_by_hand() -> None:
    ids = torch.zeros(1, 3, dtype=torch.long)
    # a left-padded row, padded to 4 columns: causal over the real keys, and each query sees itself (the padding
    # query at 0 sees nothing else; no real query sees a padding key)
    mask = global_attention_mask({"input_ids": ids, "attention_mask": torch.tensor([[0, 1, 1]])}, 4)
    assert mask is not None and mask.shape == (1, 1, 4, 4)
    assert mask[0, 0].tolist() == [[T, F, F, F], [F, T, F, F], [F, T, T, F], [F, T, T, T]]
    # packed: samples [0, 1] and [0, 1, 2], the padding column joins the last one after its end
    ids = torch.zeros(1, 5, dtype=torch.long)
    mask = global_attention_mask({"input_ids": ids, "position_ids": torch.tensor([[0, 1, 0, 1, 2]])}, 6)
    assert mask is not None
    assert mask[0, 0].tolist() == [
        [T, F, F, F, F, F],
        [T, T, F, F, F, F],
        [F, F, T, F, F, F],
        [F, F, T, T, F, F],
        [F, F, T, T, T, F],
        [F, F, T, T, T, T],
    ]


def test_plain_causal_rows_take_no_mask() -> None:
    ids = torch.zeros(2, 5, dtype=torch.long)
    # no padding inside: the end padding is causally after every real token
    assert global_attention_mask({"input_ids": ids, "attention_mask": torch.ones(2, 5)}, 6) is None
    assert global_attention_mask({"input_ids": ids, "position_ids": torch.arange(5).expand(2, -1)}, 6) is None
    assert global_attention_mask({"input_ids": ids}, 6) is None
    # a 2-D mask is read as padding, not packing (as transformers does): restarts in the positions are ignored
    assert global_attention_mask({"input_ids": ids, "attention_mask": torch.ones(2, 5), "position_ids": ids}, 6) is None


def test_plain_causal_rows_build_no_square() -> None:
    """Deciding that a long plain row needs no mask allocates nothing of [length, length] (it once built the causal
    square first: a transient S^2 bytes per rank, more than the activations sp divides at 16k tokens)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    n = 2048
    ids = torch.zeros(1, n, dtype=torch.long)
    padded = {"input_ids": ids, "attention_mask": torch.ones(1, n)}
    packed = {"input_ids": ids, "position_ids": torch.arange(n)[None]}
    for inputs in (padded, packed):
        tracker = MemTracker()
        with tracker:
            assert global_attention_mask(inputs, n) is None
        assert tracker.get_tracker_snapshot("peak")[CPU]["Total"] < n * n // 16


def test_shared_prompt_mask_padded_bool_or_additive() -> None:
    b = _batch([(2, 0), (2, 2), (0, 1)])
    b.input_ids[1, :7] = b.input_ids[0, :7]  # two samples of one prompt share it
    p = pack(b, slice(None), shared=True)
    assert p.segment is not None
    t = p.ids.shape[1]
    base = {"input_ids": p.ids, "position_ids": p.pos}
    boolean = global_attention_mask({**base, "attention_mask": p.attention(CPU)}, t + 3)
    additive = global_attention_mask({**base, "attention_mask": p.attention(CPU, torch.float32)}, t + 3)
    assert boolean is not None and additive is not None and torch.equal(boolean, additive)
    assert torch.equal(boolean[..., :t, :t], p.attention(CPU))
    assert not boolean[..., :t, t:].any()  # no real token sees the padding
    assert torch.equal(boolean[..., t:, t:], torch.eye(3, dtype=torch.bool).expand(p.ids.shape[0], 1, 3, 3))


def _tiny(heads: int = 4, kv: int = 2) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32 * heads, intermediate_size=64, num_hidden_layers=1, num_attention_heads=heads,
        num_key_value_heads=kv, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def _hf_mask(config: Qwen2Config, inputs: dict[str, Any]) -> torch.Tensor:
    b, t = inputs["input_ids"].shape
    mask = create_causal_mask(
        config, torch.zeros(b, t, 8), inputs.get("attention_mask"), None, inputs.get("position_ids"),
        allow_is_causal_skip=False,
    )  # fmt: skip
    assert isinstance(mask, torch.Tensor)
    return mask


def test_global_mask_is_transformers_mask_on_real_queries() -> None:
    """Where a query is a real token, the global mask (unpadded) is what transformers builds for sdpa."""
    config = _tiny().config
    b = _batch([(0, 0), (3, 1), (1, 4), (2, 5)])
    padded = model_inputs(b, slice(None), 0, b.input_ids.shape[1], CPU)
    ours = global_attention_mask(padded, b.input_ids.shape[1])
    real = b.attention_mask.bool()  # [b, T]: the real queries
    assert ours is not None and torch.equal(ours[:, 0][real], _hf_mask(config, padded)[:, 0][real])
    packed = pack(b, slice(None)).inputs(CPU)
    assert packed.keys() == {"input_ids", "position_ids", "use_cache"}
    ours = global_attention_mask(packed, packed["input_ids"].shape[1])
    assert ours is not None and torch.equal(ours, _hf_mask(config, packed))


def test_one_rank_is_the_identity() -> None:
    model = _tiny()
    b = _batch([(0, 0), (3, 1)])
    inputs = model_inputs(b, slice(None), 0, b.input_ids.shape[1], CPU)
    with sequence_parallel(model, SequenceShard.of(None), inputs) as local:
        assert local is inputs
        assert model.config._attn_implementation == "sdpa"


def _stub(impl: str = "sdpa", heads: int = 4, **extra: Any) -> torch.nn.Module:
    model = torch.nn.Module()
    settings = {"_attn_implementation": impl, "sub_configs": {}, "num_attention_heads": heads}
    model.config = SimpleNamespace(**{"layer_types": ["full_attention"], **settings, **extra})  # type: ignore[assignment]
    return model


@pytest.mark.parametrize(
    ("model", "inputs", "match"),
    [
        (_stub("flash_attention_2"), {}, "attn_implementation='sdpa'"),
        (_stub(heads=3), {}, "num_attention_heads=3"),
        (_stub(layer_types=["sliding_attention"]), {}, "full attention"),
        (_stub(), {"pixel_values": None}, "pixel_values"),
        (_stub(), {"position_ids": torch.zeros(3, 1, 4, dtype=torch.long)}, "M-RoPE"),
    ],
)
def test_what_cannot_run_is_refused(model: torch.nn.Module, inputs: dict[str, Any], match: str) -> None:
    inputs = {"input_ids": torch.zeros(1, 4, dtype=torch.long), **inputs}
    with pytest.raises(ValueError, match=match), sequence_parallel(model, SequenceShard(None, 0, 2), inputs):
        pass


def test_attention_without_its_plan_fails() -> None:
    q = torch.zeros(1, 4, 3, 8)
    with pytest.raises(RuntimeError, match="inside `sequence_parallel`"):
        ulysses_attention_forward(torch.nn.Module(), q, q, q, None)
