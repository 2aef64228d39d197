"""Tests of torchrl_post/workers/flops.py: the model's counts against its config by hand, the FLOP formula against
torch's own FLOP counter on a real forward and backward, and the shared-prompt pairs against the pairs the packed
attention plan computes."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from tests.unit.workers.helpers import CPU, _groups
from torchrl_post.workers.flops import (
    ModelFlops,
    causal_pairs,
    peak_tflops,
    shared_pairs,
    training_flops,
)
from torchrl_post.workers.packing import pack

H, FF, L, HEADS, KV, V = 64, 96, 2, 4, 2, 80


def _llama(tied: bool = False, attention: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=HEADS,
        num_key_value_heads=KV, max_position_embeddings=64, attn_implementation=attention, tie_word_embeddings=tied,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).float()


def test_counts_from_the_modules() -> None:
    d = H // HEADS
    per_layer = H * H + 2 * H * KV * d + H * H + 3 * H * FF  # q, k, v, o; gate, up, down
    for tied in (False, True):  # a tied head is still the output embedding, not a dense weight
        assert ModelFlops.of(_llama(tied)) == ModelFlops(L * per_layer, V * H, L * HEADS * d)
    moe = Qwen3MoeForCausalLM(
        Qwen3MoeConfig(
            vocab_size=V,
            hidden_size=H,
            intermediate_size=FF,
            moe_intermediate_size=32,
            num_hidden_layers=L,
            num_attention_heads=HEADS,
            num_key_value_heads=KV,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )  # fmt: skip
    )
    attn = H * HEADS * 16 + 2 * H * KV * 16 + HEADS * 16 * H
    experts = 2 * 3 * H * 32  # two of the four experts a token, each gate, up, down
    router = 4 * H
    assert ModelFlops.of(moe) == ModelFlops(L * (attn + experts + router), V * H, L * HEADS * 16)


def test_formula_equals_torch_flop_counter() -> None:
    """One row of n tokens, forward and backward, logits at every position: torch counts 2 per multiply-add of
    every matrix product, eager attention's over the full n x n scores (no causal halving), so the attention is
    given n^2 pairs here."""
    model, n = _llama(attention="eager"), 24
    ids = torch.randint(0, V, (1, n), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    assert counter.get_total_flops() == training_flops(ModelFlops.of(model), n, n, n * n)


def test_causal_and_shared_pairs_equal_the_packed_plan() -> None:
    """Two prompts of 7 tokens, 4 samples each with ragged responses: the pairs `shared_pairs` estimates from the
    token counts equal those the packed attention plan computes block by block (equal prompt lengths: exact)."""
    b = _groups([2, 2], [[0, 1, 3, 2], [4, 0, 2, 1]])
    lengths = b.attention_mask.sum(-1)
    responses = float(b.response_mask.sum())
    p = pack(b, slice(0, len(b)), True)
    flat = p.trimmed()
    plan = flat.row_attention(CPU)
    planned = 0.0
    for blk in plan.blocks:
        n = blk.query[1] - blk.query[0]
        planned += n * (n + 1) / 2 if blk.mask is None else float(blk.mask.sum())
    real = float(lengths.sum())
    assert flat.tokens < real  # the prompt is shared
    assert causal_pairs(lengths) == sum(int(k) * (int(k) + 1) / 2 for k in lengths)
    assert shared_pairs(causal_pairs(lengths), real, flat.tokens, real - responses, len(b)) == planned
    assert shared_pairs(10.0, 5.0, 5.0, 3.0, 1.0) == 10.0  # nothing shared, nothing taken


def test_peak_only_for_known_devices_and_16_bit() -> None:
    assert peak_tflops(CPU, torch.bfloat16) is None
    assert peak_tflops(torch.device("cuda", 0), torch.float32) is None  # asks CUDA nothing for float32
