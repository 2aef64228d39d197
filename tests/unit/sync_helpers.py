"""Tiny tied and untied models and the weight sync's stream, shared by the sync and rollout tests."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from torchrl_post.sync.weights import tied_aliases, with_aliases

SIZES = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1}


def tied_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**SIZES, **HEADS, tie_word_embeddings=True)).eval()


def untied_qwen(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**SIZES, **HEADS, tie_word_embeddings=False)).eval()


def stream(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What the sync streams, without a process group: the parameters, tied embeddings under both names."""
    params = ((n, p.detach()) for n, p in model.named_parameters())
    return with_aliases(params, tied_aliases(model))
