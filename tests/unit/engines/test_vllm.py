"""Tests of torchrl_post/engines/vllm.py: the dummy start keeps buffers, vLLM's reload reports accounted, and
its hermes tool-call parser; the KV cache capped at what the sequences fill on CPU and CUDA, and the colocated
share read after the trainer's cache is emptied."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import torch

from torchrl_post.engines.vllm import (
    RELOAD_LOGGERS,
    ReloadAccount,
    dummy_keeping_buffers,
    reload_misses,
    tool_parser_names,
)

# --- the dummy start ---------------------------------------------------------------------------------------------


class InputNorm(torch.nn.Module):
    """Like vLLM's FusedMMInputNorm in a Qwen-VL vision tower: no parameters, the processor's image mean and std
    as persistent buffers (no HF model holds them: the weight sync cannot bring them)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.tensor([2.0, 3.0, 4.0]))
        self.register_buffer("bias", torch.tensor([-1.0, -1.5, -2.0]))
        self.register_buffer("cache", torch.ones(3), persistent=False)


def _dummy_start(load_format: str) -> torch.nn.Module:
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    model = torch.nn.Sequential(InputNorm(), torch.nn.Linear(3, 3))
    torch.nn.init.zeros_(model[1].weight)
    get_model_loader(LoadConfig(load_format=load_format)).load_weights(model, None)  # type: ignore[arg-type]
    return model


def test_dummy_start_keeps_buffers_and_randomises_parameters() -> None:
    model = _dummy_start(dummy_keeping_buffers())
    assert torch.equal(model[0].weight, torch.tensor([2.0, 3.0, 4.0]))
    assert torch.equal(model[0].bias, torch.tensor([-1.0, -1.5, -2.0]))
    assert model[1].weight.abs().sum() > 0, "the parameters are random until the first sync"
    # vLLM's own dummy start randomises the persistent buffers: why the engine needs the one above
    plain = _dummy_start("dummy")
    assert not torch.equal(plain[0].weight, torch.tensor([2.0, 3.0, 4.0]))


# --- the vLLM engine's accounting (vLLM's reload reports, as its loggers emit them) ------------------------------

PARAM_LAYERS = {
    "VocabParallelEmbedding": ["model.embed_tokens"],
    "ParallelLMHead": ["lm_head"],
    "RMSNorm": [f"model.layers.{i}.{n}" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")]
    + ["model.norm"],
}


def test_rotary_caches_are_quiet_and_a_layer_with_parameters_is_named() -> None:
    assert reload_misses(["RotaryEmbedding", "MRotaryEmbedding"], [], PARAM_LAYERS) is None
    error = reload_misses(["RotaryEmbedding", "ParallelLMHead"], [], PARAM_LAYERS)
    assert error is not None and "ParallelLMHead (lm_head)" in error and "Rotary" not in error
    assert "sync missed" in error
    error = reload_misses(["RMSNorm"], ["model.norm.weight"], PARAM_LAYERS)
    assert error is not None and "RMSNorm (some of its 5 layers" in error and "model.norm.weight" in error


@pytest.fixture
def vllm_at_error_level() -> Iterator[list[logging.LogRecord]]:
    """vLLM's logger as VLLM_LOGGING_LEVEL=ERROR leaves it (no propagation, its own level); what it prints."""
    root = logging.getLogger("vllm")
    saved = root.level, root.propagate
    printed: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = printed.append  # type: ignore[method-assign]
    root.setLevel(logging.ERROR)
    root.propagate = False
    root.addHandler(handler)
    yield printed
    root.removeHandler(handler)
    root.setLevel(saved[0])
    root.propagate = saved[1]


def test_reload_account_takes_vllm_reports_even_at_a_quieter_level(vllm_at_error_level: list) -> None:
    layerwise, inplace = (logging.getLogger(name) for name in RELOAD_LOGGERS)
    with ReloadAccount() as account:
        layerwise.warning("%s: Failed to load weights", "RotaryEmbedding")
        layerwise.warning("%s: Failed to load weights", "ParallelLMHead")
        inplace.warning("Following weights were not loaded from checkpoint: %s", {"model.norm.weight"})
        layerwise.warning("Allocating %.1f MB of device memory", 1.0)  # below the level set: stays unprinted
        layerwise.error("something else")  # at the level set: printed as before
    assert account.layers == ["RotaryEmbedding", "ParallelLMHead"]
    assert account.params == ["model.norm.weight"]
    assert [r.getMessage() for r in vllm_at_error_level] == ["something else"]
    assert not layerwise.filters and layerwise.level == logging.NOTSET, "the loggers are left as they were"
    layerwise.warning("%s: Failed to load weights", "ParallelLMHead")  # outside a reload: not taken
    assert account.layers == ["RotaryEmbedding", "ParallelLMHead"]


def test_hermes_calls_parsed(parse) -> None:  # type: ignore[no-untyped-def]
    one = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    assert parse(one) == (True, [("calculator", json.dumps({"expression": "2+3"}))])
    two = one + '<tool_call>{"name": "shout", "arguments": {"text": "hi", "times": 2}}</tool_call>'
    tried, calls = parse("thinking... " + two)
    assert tried and [c[0] for c in calls] == ["calculator", "shout"] and json.loads(calls[1][1])["times"] == 2
    assert parse("The answer is 5.") == (False, [])
    assert parse('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>') == (True, [])
    assert "hermes" in tool_parser_names()


# --- what the engine allocates and compiles at its start on CPU --------------------------------------------------


def test_kv_cache_need_counts_k_and_v_of_every_layer_in_whole_blocks() -> None:
    from transformers import Qwen2Config, Qwen2VLConfig

    from torchrl_post.engines.base import kv_cache_need

    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    # 2 (K, V) x 2 layers x 1 KV head x head_dim 32 x 4 bytes = 512 bytes a token; 100 tokens fill one block of 128,
    # and vLLM's block pool keeps one block back
    assert kv_cache_need(cfg, 4, sequences=3, max_model_len=100) == 512 * (3 + 1) * 128
    assert kv_cache_need(cfg, 2, sequences=1, max_model_len=129, block_size=32) == 256 * (5 + 1) * 32
    # tensor parallel: a rank holds its share of the kv heads, one at least (vLLM replicates the only one)
    assert kv_cache_need(cfg, 4, 3, 100, tensor_parallel_size=2) == 512 * (3 + 1) * 128
    four = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4)
    assert kv_cache_need(four, 4, 3, 100, tensor_parallel_size=2) == 2 * 2 * 2 * 16 * 4 * (3 + 1) * 128
    vlm = Qwen2VLConfig(text_config={"hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
                                     "num_key_value_heads": 2})  # fmt: skip
    assert kv_cache_need(vlm, 4, sequences=1, max_model_len=128) == 2 * 3 * 2 * 24 * 4 * (1 + 1) * 128  # the text's


def test_kv_cache_capped_at_what_the_sequences_fill_on_cpu_and_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """One cap for both devices: min(need, budget). 4 sequences of 200 tokens of the tiny config above take 2
    blocks of 128 each, plus the null block: 9 x 128 tokens x 512 bytes = 589,824 bytes. On CPU it is vLLM's
    kv_cache_memory_bytes (the budget rollout.cpu_kvcache_space_gb); on CUDA the worker lowers what vLLM's profile
    leaves of its share to it, and leaves a smaller profile's answer alone."""
    from transformers import Qwen2Config
    from vllm.v1.worker.gpu_worker import Worker

    from torchrl_post.engines.base import GiB, kv_cache_cap, kv_cache_need
    from torchrl_post.engines.vllm import kv_cache_args
    from torchrl_post.engines.vllm_worker import KV_NEED, KVCappedWorker

    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    need = kv_cache_need(cfg, 4, sequences=4, max_model_len=200)
    assert need == 9 * 128 * 512 == 589_824
    assert kv_cache_cap(need, 1 * GiB) == need and kv_cache_cap(need, 100_000) == 100_000

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert kv_cache_args("cpu", need, 1) == {"kv_cache_memory_bytes": need}
    assert kv_cache_args("cpu", 3 * GiB, 1) == {"kv_cache_memory_bytes": 1 * GiB}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # vLLM's own setting wins
    assert kv_cache_args("cpu", need, 1) == {}

    cuda = kv_cache_args("cuda", need, 1)
    assert cuda == {
        "worker_cls": "torchrl_post.engines.vllm_worker.KVCappedWorker",
        "additional_config": {KV_NEED: need},
    }
    worker = object.__new__(KVCappedWorker)  # no device: only its KV sizing runs
    worker.vllm_config = type("Config", (), {"additional_config": cuda["additional_config"]})()  # type: ignore[assignment]
    for profiled, kept in ((40 * GiB, need), (100_000, 100_000)):
        monkeypatch.setattr(Worker, "determine_available_memory", lambda self, b=profiled: b)
        assert worker.determine_available_memory() == kept


def test_engine_share_read_after_the_trainer_cache_is_emptied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Colocated with rollout.gpu_memory_utilization unset, the free memory is read after torch's cache is
    emptied (the trainer's cached blocks are the engine's to take); a CPU engine touches neither."""
    from torchrl_post.engines.base import EngineSpec, GiB
    from torchrl_post.engines.vllm import _memory_share

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    def mem_get_info(device: torch.device) -> tuple[int, int]:
        calls.append("mem_get_info")
        return 60 * GiB, 80 * GiB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    spec = EngineSpec(max_model_len=64, lora_sync="none", prefix_caching=False, load_format="auto")
    assert _memory_share(spec, torch.device("cpu"), 0) == 0.5 and calls == []
    assert _memory_share(spec, torch.device("cuda", 0), 10 * GiB) == pytest.approx(0.9 * 50 / 80)
    assert calls == ["empty_cache", "mem_get_info"]


def test_the_rank_count_runs_eagerly_and_counts_the_same() -> None:
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import logprobs

    from torchrl_post.engines.vllm import _eager_rank_count

    compiled = logprobs.batched_count_greater_than
    _eager_rank_count()
    assert sampler.batched_count_greater_than is compiled._torchdynamo_orig_callable  # type: ignore[attr-defined]
    x, v = torch.randn(3, 50), torch.randn(3, 1)
    assert torch.equal(sampler.batched_count_greater_than(x, v), (x >= v).sum(-1))
    _eager_rank_count()  # a second engine: already eager, left alone
    assert sampler.batched_count_greater_than is compiled._torchdynamo_orig_callable  # type: ignore[attr-defined]
