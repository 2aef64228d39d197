"""Tests of torchrl_post/sync/weights.py: wire buckets, and tied embeddings streamed under both names."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from tests.unit.sync_helpers import stream, tied_llama, untied_qwen
from torchrl_post.sync.lora import is_adapter, lora_scale, merged_weights
from torchrl_post.sync.weights import WireBucket, plan_wire, split_bucket, tied_aliases

# --- weight sync buckets --------------------------------------------------------------------------------------


def test_plan_wire_by_size_dtype_and_shard_world() -> None:
    f32, bf16 = torch.float32, torch.bfloat16
    specs = [
        ("a", (4, 4), f32, 2),  # 2 rows per rank slot of 4 -> 8 elements a slot, 64 B in full
        ("b", (3,), f32, 2),  # rows 2 per slot (the second rank holds 1): 2 elements, 16 B in full
        ("c", (100,), f32, 2),  # 400 B: alone
        ("d", (2,), bf16, 2),  # a dtype change starts a bucket
        ("e", (2,), bf16, 1),  # so does an unsharded parameter
    ]
    buckets = plan_wire(specs, bucket_bytes=96)
    assert [[e[0] for e in b.entries] for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert buckets[0].entries == (("a", (4, 4), 2, 8), ("b", (3,), 2, 2))
    assert (buckets[0].slot, buckets[0].numel, buckets[0].nbytes) == (10, 20, 80)
    assert buckets[3].world == 1 and buckets[3].nbytes == 4


def test_split_bucket_undoes_the_rank_major_layout() -> None:
    """What one all_gather of [a rows 0-1, b rows 0-1] and [a rows 2-3, b row 2, pad] looks like."""
    a, b = torch.arange(16.0).view(4, 4), torch.tensor([100.0, 101.0, 102.0])
    bucket = WireBucket(torch.float32, 2, (("a", (4, 4), 2, 8), ("b", (3,), 2, 2)))
    rank0 = torch.cat([a[:2].reshape(-1), b[:2]])
    rank1 = torch.cat([a[2:].reshape(-1), b[2:], torch.zeros(1)])
    got = dict(split_bucket(torch.cat([rank0, rank1]), bucket))
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b)


# --- tied embeddings in the sync's stream -----------------------------------------------------------------------


def test_tied_embeddings_are_streamed_under_both_names_once_gathered() -> None:
    model = tied_llama()
    assert "lm_head.weight" not in dict(model.named_parameters()), "named_parameters lists a tied weight once"
    assert tied_aliases(model) == (("lm_head.weight", "model.embed_tokens.weight"),)
    names = [n for n, _ in stream(model)]
    assert names.index("lm_head.weight") == names.index("model.embed_tokens.weight") + 1
    sent = dict(stream(model))
    assert sent["lm_head.weight"] is sent["model.embed_tokens.weight"], "the alias is the same tensor, not a copy"
    assert tied_aliases(untied_qwen()) == ()


def test_tied_aliases_under_peft_reach_the_merged_stream_under_hf_names() -> None:
    """LoRA merged mode: PEFT names in, the merged model's HF names out, the LM head among them."""
    peft = get_peft_model(tied_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    aliases = tied_aliases(peft)
    assert aliases == (("base_model.model.lm_head.weight", "base_model.model.model.embed_tokens.weight"),)
    assert tied_aliases(peft, keep=is_adapter) == (), "adapter mode sends only the adapter"
    merged = dict(merged_weights(stream(peft), lora_scale(4, 8)))
    assert torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])
