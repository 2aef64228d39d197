"""The rollout engine's contract: sampling parameters, the one stepped protocol (`Stepped`, `RolloutEngine`), a
whole batch as a driver over it (`generate`), and what an engine takes from the run plan (`EngineSpec`, its memory
share and KV-cache size). The engines: engines/vllm.py (in-process vLLM), engines/hf.py (transformers); tensor-parallel
lockstep: engines/lockstep.py; turning what they return into a `Batch`: engines/batch.py."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from torchrl_post.config.errors import ConfigError
from torchrl_post.types import Generation


@dataclass(frozen=True)
class SamplingParams:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int
    """Base seed; each prompt's seed is derived from it and the prompt's uid, independent of batching."""
    sample: int = 0
    """Which of a prompt's samples a request is: its seed is the prompt's plus `sample`, as vLLM seeds the j-th
    sample of an n-sample request (`generate`)."""

    progress: bool = True
    """`step` reports the request's new tokens as they come (streams: each token's policy version); False: all of them
    when it finishes (a whole batch, `generate`: no output is built per step, as `LLM.generate` builds none)."""

    def prompt_seed(self, uid: int) -> int:
        return (self.seed * 1_000_003 + uid) % (2**31 - 1) + self.sample


@dataclass(frozen=True)
class EngineSpec:
    """What an engine takes from the run plan besides `model.*` and `rollout.*`."""

    max_model_len: int
    """Prompt plus response tokens (data.max_prompt_length + data.max_response_length)."""
    lora_sync: str
    """none / merged (the engine gets merged weights) / adapter (the engine serves the adapter)."""
    prefix_caching: bool
    """Prompts that repeat: an agent's turns (each grows the last one) and a group's n samples of one prompt
    (computed once, not n times). vLLM caches on GPU by default; on CPU its 128-token blocks would never fill on
    short prompts, so this also sets the smallest block its CPU attention takes (`engines/vllm.py`)."""
    load_format: str
    """dummy (random until the first sync: only when the caller pushes weights first) or auto."""
    dtype: str = "float32"
    """The engine's weight dtype (rollout.dtype with `auto` resolved by device)."""
    enforce_eager: bool = True
    """No CUDA graphs (rollout.enforce_eager; null resolved by device)."""
    gpu_memory_utilization: float | None = None
    """vLLM's share of the GPU; None: sized from the memory free when the engine starts
    (`engine_memory_fraction`)."""
    sleep_level: int = 0
    """vLLM sleep level during the update: 0 never sleeps, 1 keeps weights in host memory, 2 discards them."""
    record_routes: bool = False
    """A mixture-of-experts model's engine returns each token's experts (rollout.return_routed_experts)."""
    routes_from_engine: bool = False
    """Where the experts come from: vLLM's own capture (`enable_return_routed_experts`, its CUDA model runner V2:
    a preallocated device buffer, CUDA graphs fine) on CUDA; the router hook (engines/vllm.py `RouteRecorder`) on
    CPU, where V2 does not run. On CUDA the hook would read `runner.input_batch`, which V2 lacks, and inside a CUDA
    graph's compiled MoE op it is never called."""
    updates_in_flight: bool = False
    """Weights load while requests run (rollout.partial_rollout): each step's tokens must come from the weights
    loaded before it, so no step may be scheduled ahead of the load (vLLM's async scheduling, its CUDA default,
    samples one token per running request with the old weights that the stream would label with the new version)."""

    def scheduler_options(self) -> dict[str, Any]:
        """vLLM's scheduler options this spec fixes (none: vLLM's defaults)."""
        return {"async_scheduling": False} if self.updates_in_flight else {}


@dataclass
class StepOutput:
    """One request's progress in a stepped engine's step (`add_request` / `step`, rollout/inflight.py)."""

    request_id: str
    token_ids: list[int]
    """The tokens generated since this request's last output (all of them for one that reports only at its end,
    `SamplingParams.progress=False`)."""
    logprobs: list[float]
    """The engine's logprob of each of them."""
    finish_reason: str | None = None
    """stop or length once finished; None while it runs."""
    routes: torch.Tensor | None = None
    """A finished request's experts ([prompt + tokens - 1, layers, k], `RouteRecorder.take`) where the engine
    records them (rollout.return_routed_experts on a mixture-of-experts model); else None."""


ENGINE_SHARE_OF_FREE = 0.9
"""The share of the memory free when an engine starts that it takes (the rest: allocator slack): of the whole card on
rollout ranks of their own (their gpu_memory_utilization), of what a colocated trainer leaves (`engine_memory_fraction`;
the memory plan sizes the engine so too)."""
KV_BLOCK_TOKENS = 128
"""vLLM's KV cache block on CPU (its GPU blocks are smaller): a sequence takes whole blocks."""
GiB = 1 << 30


def engine_memory_fraction(free: int, total: int, reserve: int, share: float = ENGINE_SHARE_OF_FREE) -> float:
    """vLLM's gpu_memory_utilization (a fraction of the card) for an engine that starts beside a trainer: `share`
    of what is free now less `reserve` (what the trainer will still allocate: its optimizer state at the first
    step). Raises ConfigError when nothing would be left."""
    left = free - reserve
    if left <= 0.05 * total:
        raise ConfigError(
            f"rollout.gpu_memory_utilization: the trainer leaves {left / GiB:.1f} GiB of {total / GiB:.1f} GiB "
            "for the colocated engine; set actor.fsdp.optimizer_offload=true / actor.fsdp.param_offload=true, "
            "shard over more ranks, or give the engine ranks of its own (placement.rollout)"
        )
    return share * left / total


def kv_dims(hf_config: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of a model's text config: what its KV cache holds per token."""
    text = hf_config.get_text_config()
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return int(text.num_hidden_layers), kv_heads, int(getattr(text, "head_dim", None) or text.hidden_size // heads)


VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM 0.32's CPU attention takes (v1/attention/backends/cpu_attn.py
`get_supported_head_sizes`); any other fails every request with "Unsupported CPU attention configuration"."""


def unsupported_head_size(hf_config: Any, engine: str, device_type: str) -> int | None:
    """The model's head size where the engine cannot run it (vLLM on CPU, `VLLM_CPU_HEAD_SIZES`); else None."""
    head = kv_dims(hf_config)[2]
    return head if engine == "vllm" and device_type == "cpu" and head not in VLLM_CPU_HEAD_SIZES else None


def kv_cache_bytes(
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    sequences: int,
    max_model_len: int,
    block_size: int = KV_BLOCK_TOKENS,
    tensor_parallel_size: int = 1,
) -> int:
    """Bytes of K and V in every layer on one tensor-parallel rank for `sequences` sequences of `max_model_len`
    tokens, each rounded up to whole blocks of `block_size` tokens, plus the one block vLLM's block pool keeps back
    (its null block): all an engine can hold at once (rollout.max_num_seqs running). A rank holds kv_heads / tp
    heads, one at least (vLLM replicates a head over the ranks when tp > kv_heads). The one formula: the engine
    caps its KV cache at it (`kv_cache_cap`) and the memory plan counts it."""
    tokens = (sequences * -(-max_model_len // block_size) + 1) * block_size
    return 2 * layers * max(kv_heads // tensor_parallel_size, 1) * head_dim * dtype_bytes * tokens


def kv_cache_need(
    hf_config: Any,
    dtype_bytes: int,
    sequences: int,
    max_model_len: int,
    block_size: int = KV_BLOCK_TOKENS,
    tensor_parallel_size: int = 1,
) -> int:
    """`kv_cache_bytes` of an HF model config's text model."""
    return kv_cache_bytes(*kv_dims(hf_config), dtype_bytes, sequences, max_model_len, block_size, tensor_parallel_size)


def kv_cache_cap(need: int, budget: int) -> int:
    """The KV cache an engine rank allocates: what its sequences can fill (`need`, `kv_cache_need`), at most its
    `budget`. The budget is rollout.cpu_kvcache_space_gb on CPU and, on CUDA, what vLLM's profile leaves of its
    gpu_memory_utilization share after weights and activations; vLLM alone would give the KV cache the whole budget
    whatever rollout.max_num_seqs, memory no sequence can use (and, on CPU, seconds spent zeroing it)."""
    return min(need, budget)


class Stepped(Protocol):
    """The stepped calls: requests are added, each engine step advances all of them, weights load between two steps.
    A whole batch is a driver over them (`generate`), a stream of groups carried across updates another
    (rollout/inflight.py), an agent's turns a third (agent/loop.py). An engine, or engines/lockstep.py's wrapper of
    one."""

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        uid: int,
        images: list[Any] | None = None,
    ) -> None:
        """Queue one sample of `prompt_ids` (`params.n` is ignored) seeded by `params.prompt_seed(uid)`; `images`:
        the prompt's (vision-language models), whose placeholder tokens the ids hold expanded."""
        ...

    def step(self) -> list[StepOutput]:
        """One engine step: every request that progressed, with the tokens it gained."""
        ...

    def abort(self, request_ids: list[str]) -> None: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with (HF name, full tensor) pairs, consumed in order."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Forget cached prefixes; False where some stay (requests still running), which must then never be read
        by a request of newer weights."""
        ...


class RolloutEngine(Stepped, Protocol):
    """The one engine protocol (engines/vllm.py, engines/hf.py): the stepped calls and the engine's
    life around them."""

    def sleep(self) -> None:
        """Free accelerator memory before the update (no-op where unsupported)."""
        ...

    def wake_up(self) -> None: ...

    def shutdown(self, process_ends: bool = False) -> None:
        """Free what the engine holds. `process_ends`: the process ends right after (the command line's
        `end_process`), so only what would outlive it goes (temporary files); memory and the engine's own process
        groups go with the process (vLLM's teardown is about a second per launch)."""
        ...


def generate(
    engine: Stepped,
    prompt_ids: list[list[int]],
    uids: list[int],
    params: SamplingParams,
    images: list[list[Any]] | None = None,
) -> Generation:
    """`params.n` samples of each prompt, prompt-major, as one batch through the stepped calls: every request added
    first, in the order vLLM's `LLM.generate` adds an n-sample request's samples (sample j seeded by the prompt's seed
    plus j), then engine steps until every one finished. Each prompt's images go with each of its samples. With
    recorded experts, `Generation.routed_experts` holds each sample's."""
    order: list[str] = []
    for i, (ids, uid) in enumerate(zip(prompt_ids, uids, strict=True)):
        for j in range(params.n):
            rid = f"batch-{i}-{j}"
            one = replace(params, n=1, sample=j, progress=False)
            engine.add_request(rid, ids, one, uid, images[i] if images else None)
            order.append(rid)
    done: dict[str, StepOutput] = {}
    # Every step advances each running request by a token (or a prefill); past this many the engine lost some.
    bound = len(order) * (params.max_tokens + max(map(len, prompt_ids), default=0) + 1)
    steps = 0
    while len(done) < len(order):
        done |= {o.request_id: o for o in engine.step() if o.finish_reason is not None}
        steps += 1
        if steps > bound:
            lost = [rid for rid in order if rid not in done]
            raise RuntimeError(f"the rollout engine stopped advancing requests {lost[:4]} ({len(lost)} in all)")
    outs = [done[rid] for rid in order]
    routes = [o.routes for o in outs]
    return Generation(
        [o.token_ids for o in outs],
        [o.logprobs for o in outs],
        [o.finish_reason or "length" for o in outs],
        routed_experts=None if any(r is None for r in routes) else [r for r in routes if r is not None],
    )
