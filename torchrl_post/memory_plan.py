"""The memory plan: what every rank will hold, estimated before anything loads, and a refusal when it cannot fit.

    shape = model_shape(cfg.model)                   # config.json and a meta-device build: no weights, no tokenizer
    memory = plan_memory(cfg, plan, shape, "cuda", card_bytes=80 * GiB)
    print(memory.describe())                         # what trainer.dry_run=true prints after the run plan
    memory.check()                                   # one ConfigError line naming the keys to change (GPU only)

Symbols: P parameters, P_t the trained ones (the LoRA adapter's with model.lora_rank > 0), P_l one decoder layer,
P_r the rest (embeddings, final norm, LM head: FSDP's root unit), S the ranks a parameter is sharded over (the
last mesh dim), m / p / r the bytes of model.dtype / fsdp.param_dtype / fsdp.reduce_dtype, f = 4 (float32),
h hidden, i intermediate (MLP), n heads, d head_dim, k kv heads, L layers, V vocabulary, T the row length
(data.max_prompt_length + max_response_length), t the tokens of one micro-batch (samples x T, or the token budget
with actor.use_dynamic_bsz). Every estimate is an upper bound for the worst case (every sample at full length).

Trained role (actor, critic), per rank:
    parameters  P m / S        gradients  P_t m / S        AdamW  2 P_t m / S   (torch keeps exp_avg and exp_avg_sq
        in the parameter's dtype; model.dtype float32 is itself the master copy, so there is no other)
    optimizer step  P_t m / S  (foreach AdamW, the default on GPU, makes one temporary per parameter: counted with
        the activations though it comes after them, an upper bound)
    with fsdp.offload_policy these sit in host memory; gradients exist only during the update
    gathered units  (2 P_l + P_r) p + P_r p + P_l (p + r if r != p)
        one layer gathered and the next prefetched, the root kept gathered through backward, the root's gradient
        (the LM head's lives through backward) and one layer's before its reduce-scatter (LoRA: the adapter's);
        fsdp.reshard_after_forward=false keeps every layer gathered: L P_l instead of 2 P_l; with expert
        parallelism a MoE layer's unit holds 1/ep of its routed experts P_e: P_l - P_e (1 - 1/ep) for P_l
    activations per token of a decoder layer (Qwen2 / Llama: RMSNorm in float32, SwiGLU, sdpa):
        A = 2 (f h + f + 2 p h)  two RMSNorms: the float32 input, 1/rms, the normed and the scaled output
          + 4 p n d              q, and k, v repeated to every head (a padding mask keeps HF's repeat_kv), the output
          + f n                  the kernel's logsumexp: sdpa keeps no T x T term
          + 4 p i                gate, up, silu(gate), their product
        measured on CPU to the byte for float32 and bfloat16 (tests/unit/test_memory_plan.py); on top, per token:
        E = f h + f + 2 p h (the final norm) + p T (the sdpa mask, one per forward)
        no checkpointing:   t (L A + E + p h + 3 p i)   the last term: the first layer's backward (its output's
                                                         gradient and three MLP-wide gradients)
        checkpointing:      t (L p h + A + E + p h)     each layer's input kept, one layer recomputed at a time
    loss path: c V (4 CHUNK_COPIES + p if p != 4), c = min(positions, HEAD_CHUNK_TOKENS, HEAD_CHUNK_BYTES / 4V) (the chunked head; with the
        chunk 0, all positions' logits at once: positions V (4 FULL_COPIES + p)); the positions are the response share of t
        (padded or packed, only the columns that predict response tokens reach the head); the actor's update adds
        f V h with p != 4 and a trained head (the chunked backward sums the head's gradient in float32, rounded to p
        once); the critic's head has one output, so no vocabulary term. Packing (model.use_remove_padding) drops
        padding but not the worst case: a micro-batch of samples at full length holds t tokens either way
Reference (frozen): parameters P m / S (host with reference.param_offload), gathered (2 P_l + P_r) p, and one
    no-grad forward: t (2 p h + 3 p i + f h + p T) (the residual and a layer's output, gate, up and silu, a float32
    norm input, the mask; measured) plus the loss path.
Engine (vLLM): weights P e / tp (e: the engine dtype's bytes); KV cache needs 2 L max(k / tp, 1) d e x
    (max_num_seqs x T + one block) (T in whole blocks of KV_BLOCK_TOKENS: the cap the engine sets on CPU and CUDA,
    `engines/base.py: kv_cache_bytes`) and gets the least of that and its share - weights - ENGINE_RESERVE (its
    own activations and graphs, a round guess). The share is
    rollout.gpu_memory_utilization x card, or colocated with it unset, as the engine sizes it at start:
    ENGINE_SHARE_OF_FREE x (card - the trainer's parameters - the optimizer state still to come).

Phases of a rank: generation (the trained roles' parameters and optimizer state stay unless fsdp.param_offload /
optimizer_offload move them to host; the engine takes its share), each role's update or forward (the engine asleep
when the plan's sleep level is above 0, else it keeps its share). A rank
fits when its largest phase fits the card. On CPU the plan prints host memory and never refuses.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import SELF_JUDGE, Config, FSDPConfig, ModelConfig
from torchrl_post.engines.base import ENGINE_SHARE_OF_FREE, GiB, kv_cache_bytes, kv_dims
from torchrl_post.plan import RunPlan
from torchrl_post.workers.expert_parallel import fused_experts
from torchrl_post.workers.fsdp import decoder_layers
from torchrl_post.workers.logprobs import HEAD_CHUNK_TOKENS, head_chunk_positions, head_keep_positions
from torchrl_post.workers.models import VISION_TOWER, empty_model

F32 = 4
CHUNK_COPIES = 2
"""[chunk x vocabulary] float32 tensors at the peak of the chunked head's forward and backward
(`workers/lm_head.py`): measured, not assumed."""
FULL_COPIES = 5
"""[positions x vocabulary] float32 tensors at the peak of `logits_to_logprobs` forward and backward (the scaled
logits, log_softmax, its exp and the product kept for entropy, the gradients), besides the logits: measured."""
ENGINE_RESERVE = 1 * GiB
"""What vLLM keeps besides weights and KV cache (profiling activations, sampler, graphs): not measured here."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the estimates need of a model: its text dims (config.json) and parameter counts (a meta build)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: int
    layer_params: int
    """The largest decoder layer (an FSDP unit)."""
    root_params: int
    """Outside the decoder layers: embeddings, final norm, LM head (the root unit)."""
    head_params: int
    """The LM head's own parameters (0 when tied to the embeddings)."""
    adapter_params: int
    """LoRA adapter parameters at model.lora_rank (0 without LoRA)."""
    adapter_layer_params: int
    positions: int = 0
    """max_position_embeddings (0 where the config has none)."""
    expert_layer_params: int = 0
    """The routed experts of the largest decoder layer (a MoE model's; 0 for a dense one): with expert
    parallelism a rank gathers 1/ep of them (`gathered_bytes`)."""


def _lora_targets(cfg: ModelConfig) -> str | list[str]:
    return cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)


def _adapter_params(model: torch.nn.Module, cfg: ModelConfig, module: torch.nn.Module | None = None) -> int:
    """r (in + out) for each Linear PEFT would adapt: every one but the LM head for `all-linear`, else those
    named; a vision tower never."""
    if cfg.lora_rank == 0:
        return 0
    targets, head = _lora_targets(cfg), model.get_output_embeddings()  # type: ignore[operator]
    total = 0
    for name, sub in (module or model).named_modules():
        if not isinstance(sub, torch.nn.Linear) or sub is head or re.fullmatch(VISION_TOWER, "." + name + "."):
            continue
        if targets == "all-linear" or name.rsplit(".", 1)[-1] in targets:
            total += cfg.lora_rank * (sub.in_features + sub.out_features)
    return total


def model_shape(cfg: ModelConfig, auto: Any = None) -> ModelShape:
    """model.path's config.json and its model (by `auto`, default the causal LM's class; a reward model's is
    AutoModelForSequenceClassification) built on the meta device: parameters counted, nothing loaded."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)
    text = config.get_text_config()
    model = empty_model(cfg, config, auto)
    layers = decoder_layers(model)
    layer_counts = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    expert_counts = [sum(p.numel() for e in fused_experts(layer) for p in e.parameters()) for layer in layers]
    params = sum(p.numel() for p in model.parameters())  # a tied head is one parameter, counted once
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    heads = int(text.num_attention_heads)
    n_layers, kv_heads, head_dim = kv_dims(config)
    return ModelShape(
        hidden=int(text.hidden_size),
        intermediate=int(text.intermediate_size),
        layers=n_layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=int(text.vocab_size),
        params=params,
        layer_params=max(layer_counts),
        root_params=params - sum(layer_counts),
        head_params=0 if head is None or tied else head.weight.numel(),
        adapter_params=_adapter_params(model, cfg),
        adapter_layer_params=max(_adapter_params(model, cfg, layer) for layer in layers),
        positions=int(getattr(text, "max_position_embeddings", 0) or 0),
        expert_layer_params=expert_counts[layer_counts.index(max(layer_counts))],
    )


# ---- the formulas (bytes) -------------------------------------------------------------------------------


def layer_activation_bytes(s: ModelShape, p: int) -> int:
    """A: the bytes one decoder layer keeps for backward, per token, computing in `p`-byte floats."""
    norm = F32 * s.hidden + F32 + 2 * p * s.hidden
    return 2 * norm + 4 * p * s.heads * s.head_dim + F32 * s.heads + 4 * p * s.intermediate


def activation_bytes(s: ModelShape, p: int, tokens: int, row: int, checkpointing: bool) -> int:
    """The peak of one micro-batch's forward and backward of `tokens` tokens in rows of up to `row`, less the
    loss path (see the module docstring)."""
    layer = layer_activation_bytes(s, p)
    extra = F32 * s.hidden + F32 + 2 * p * s.hidden + p * row
    if checkpointing:
        return tokens * (s.layers * p * s.hidden + layer + extra + p * s.hidden)
    return tokens * (s.layers * layer + extra + p * s.hidden + 3 * p * s.intermediate)


def forward_bytes(s: ModelShape, p: int, tokens: int, row: int) -> int:
    """The peak of a no-grad forward (reference, old logprobs) through the decoder, less the loss path: nothing is
    kept between layers, so one layer's widest moment."""
    return tokens * (2 * p * s.hidden + 3 * p * s.intermediate + F32 * s.hidden + p * row)


def loss_path_bytes(
    positions: int, vocab: int, p: int, chunk_tokens: int = HEAD_CHUNK_TOKENS, trained: bool = False
) -> int:
    """The peak of logprobs and entropy over `positions` from the hidden states, `chunk_tokens` at a time
    (CHUNK_COPIES float32 copies of a chunk's logits, and the head's output in `p`-byte floats where that is not
    float32 already), or with `chunk_tokens` 0 from the full logits (`p`-byte) and FULL_COPIES float32 copies.
    `trained`: the forward keeps the first chunks' logits for the backward (`head_keep_positions`), the first of
    which is then one of the chunk's copies."""
    if chunk_tokens <= 0:
        return positions * vocab * (F32 * FULL_COPIES + p)
    per_pass = head_chunk_positions(vocab, chunk_tokens)
    chunk = min(positions, per_pass)
    kept = min(positions, head_keep_positions(vocab, per_pass)) if trained else 0
    return (kept + (CHUNK_COPIES - (1 if kept else 0)) * chunk) * vocab * F32 + chunk * vocab * (p if p != F32 else 0)


def head_accumulator_bytes(vocab: int, hidden: int, p: int, chunk_tokens: int = HEAD_CHUNK_TOKENS) -> int:
    """The chunked head's backward sums a 16-bit (`p` < 4) head weight's gradient over the chunks in a float32
    [V, H] (`workers/lm_head.py`: one rounding to `p` at the end, not one per chunk), besides the gradient itself (a
    gathered unit's); a float32 weight's is summed in place, and the full logits (`chunk_tokens` 0) have no sum."""
    return vocab * hidden * F32 if chunk_tokens > 0 and p != F32 else 0


def gathered_bytes(s: ModelShape, fsdp: FSDPConfig, trained: bool, lora: bool) -> int:
    """FSDP's unsharded working set during forward and backward (see the module docstring). With expert
    parallelism (fsdp.expert_parallel_size = ep) a layer's unit gathers its E / ep experts only: P_l - P_e (1 - 1/ep)
    for P_l (P_e: the layer's routed experts)."""
    p, r = DTYPE_BYTES[fsdp.param_dtype], DTYPE_BYTES[fsdp.reduce_dtype]
    layers = 2 if fsdp.reshard_after_forward or not trained else s.layers
    ep = fsdp.expert_parallel_size
    layer = s.layer_params - s.expert_layer_params + s.expert_layer_params // ep
    total = (layers * layer + s.root_params) * p
    if trained and lora:
        total += s.adapter_layer_params * (p + r if r != p else p)
    elif trained:
        total += s.root_params * p + layer * (p + r if r != p else p)
    return total


# ---- the plan -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One line of a role's memory: bytes per rank, on the device or (offloaded) in host memory."""

    name: str
    bytes: int
    resident: bool
    """On the device while the engine generates (parameters, optimizer state unless fsdp.param_offload /
    optimizer_offload move them to host then), not only during the role's own stage."""
    on_host: bool = False
    note: str = ""


@dataclass(frozen=True)
class RoleMemory:
    role: str
    items: tuple[Item, ...]
    variants: tuple[tuple[str, int], ...] = ()
    """Activations under the other settings (checkpointing x packing), for the table."""

    def device(self, resident_only: bool) -> int:
        return sum(i.bytes for i in self.items if not i.on_host and (i.resident or not resident_only))

    def host(self) -> int:
        return sum(i.bytes for i in self.items if i.on_host)


@dataclass(frozen=True)
class RankGroup:
    """Ranks holding the same roles, so the same memory."""

    ranks: tuple[int, ...]
    roles: tuple[RoleMemory, ...]
    engine: tuple[Item, ...]
    """The engine's weights and KV cache (empty on ranks without one)."""
    engine_share: int
    """What the engine takes of the device: gpu_memory_utilization x card (0 on CPU or without an engine)."""
    engine_awake_in_update: bool
    kv_needed: int
    kv_available: int
    judge_share: int = 0
    """A co-hosted judge's engine (reward.judge): its part of the device in every phase (it never sleeps)."""

    def phases(self) -> dict[str, int]:
        """Device bytes at the peak of each phase this rank goes through."""
        resident = sum(r.device(resident_only=True) for r in self.roles) + self.judge_share
        out: dict[str, int] = {}
        if self.engine:
            out["generation"] = resident + self.engine_share
        for r in self.roles:
            stage = "update" if r.role in ("actor", "critic") else "forward"
            awake = self.engine_share if self.engine_awake_in_update else 0
            out[f"{r.role} {stage}"] = resident + r.device(resident_only=False) - r.device(True) + awake
        return out


@dataclass(frozen=True)
class MemoryPlan:
    device_type: str
    card_bytes: int
    """Device memory per rank: the card (trainer.gpu_memory_gb or the visible one), or host memory on CPU."""
    groups: tuple[RankGroup, ...]
    levers: dict[str, tuple[str, ...]]
    """Per phase, the keys that would make it smaller (for the refusal)."""

    def describe(self) -> str:
        where = "host memory" if self.device_type == "cpu" else "per card"
        lines = [f"memory plan ({self.device_type}, {_gib(self.card_bytes)} GiB {where}; estimates in GiB per rank):"]
        for g in self.groups:
            names = [r.role for r in g.roles] + (["rollout"] if g.engine else [])
            lines.append(f"  ranks {_ranks(g.ranks)}: {' + '.join(names)}")
            for r in g.roles:
                for item in r.items:
                    where = " (host)" if item.on_host else ""
                    note = f"  {item.note}" if item.note else ""
                    lines.append(f"    {r.role + ' ' + item.name:<26}{_gib(item.bytes):>7}{where}{note}")
                if r.variants:
                    table = "; ".join(f"{name} {_gib(b)}" for name, b in r.variants)
                    lines.append(
                        f"    {r.role} activations + loss path with gradient checkpointing {table} (packing: the same "
                        "at full length; it saves the padding)"
                    )
            for item in g.engine:
                note = f"  {item.note}" if item.note else ""
                lines.append(f"    {'engine ' + item.name:<26}{_gib(item.bytes):>7}{note}")
            if g.kv_needed > g.kv_available and self.device_type != "cpu":
                share = max(g.kv_available, 0) / g.kv_needed
                lines.append(
                    f"    engine KV cache holds {share:.0%} of rollout.max_num_seqs at full length (vLLM queues the rest)"
                )
            host = sum(r.host() for r in g.roles)
            if host:
                lines.append(f"    {'host (offloaded)':<26}{_gib(host):>7}")
            phases = ", ".join(f"{k} {_gib(v)}" for k, v in g.phases().items())
            lines.append(f"    peak by phase: {phases} (of {_gib(self.card_bytes)})")
        return "\n".join(lines)

    def check(self) -> None:
        """A ConfigError naming the keys to change when a rank's phase, or an engine's weights, cannot fit the
        card; nothing on CPU."""
        if self.device_type == "cpu":
            return
        card = self.card_bytes
        for g in self.groups:
            for phase, need in g.phases().items():
                if need > card:
                    raise ConfigError(
                        f"ranks {_ranks(g.ranks)} need {_gib(need)} GiB in the {phase} ({_parts(g, phase)}) but the "
                        f"card has {_gib(card)} GiB (trainer.gpu_memory_gb); change one of: {', '.join(self.levers[phase])}"
                    )
            weights = sum(i.bytes for i in g.engine if i.name == "weights")
            if g.engine and weights + ENGINE_RESERVE > g.engine_share:
                raise ConfigError(
                    f"ranks {_ranks(g.ranks)}: the engine's weights ({_gib(weights)} GiB) and its reserve "
                    f"({_gib(ENGINE_RESERVE)} GiB) exceed its share of the card ({_gib(g.engine_share)} of "
                    f"{_gib(card)} GiB); change one of: {', '.join(self.levers['engine'])}"
                )


def _parts(g: RankGroup, phase: str) -> str:
    role = phase.split()[0]
    parts = []
    for r in g.roles:
        for i in r.items:
            if not i.on_host and (i.resident or r.role == role):
                parts.append(f"{r.role} {i.name} {_gib(i.bytes)}")
    if g.engine and (phase == "generation" or g.engine_awake_in_update):
        parts.append(f"engine share {_gib(g.engine_share)}")
    return ", ".join(parts)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 10**9 else f"{n / 1e6:.1f}M"


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _micro_tokens(samples: int, row: int, budget: int) -> int:
    """Token cells of one micro-batch: samples x row, or the token budget (one row at least)."""
    return max(budget, row) if budget > 0 else samples * row


def _trained_role(role: str, cfg: Config, plan: RunPlan, s: ModelShape, chunk: int, value_head: bool) -> RoleMemory:
    fsdp, micro = plan.roles[role].fsdp, plan.roles[role].micro_batch_samples
    shards = plan.roles[role].mesh_shape[-1]
    m, p = DTYPE_BYTES[cfg.model.dtype], DTYPE_BYTES[fsdp.param_dtype]
    lora = cfg.model.lora_rank > 0 and role == "actor"
    params = s.params - s.head_params + s.hidden + 1 if value_head else s.params
    trained = s.adapter_params if lora else params
    d, off = cfg.data, fsdp.offload_policy
    row = d.max_prompt_length + d.max_response_length
    budget = cfg.actor.ppo_max_token_len_per_gpu if cfg.actor.use_dynamic_bsz and role == "actor" else 0
    sp = plan.roles[role].sequence_parallel  # a rank holds 1/sp of each row's tokens (the budget is per rank)
    tokens = _micro_tokens(micro, row, budget * sp) // sp
    ckpt = cfg.model.enable_gradient_checkpointing

    if value_head:
        loss, what_loss = tokens * (p + F32) * 2, "value head"  # a scalar output and its loss: no vocabulary term
    else:
        # Padded and packed alike, only the columns that predict response tokens reach the head (logits_to_keep).
        loss = loss_path_bytes(tokens * d.max_response_length // row, s.vocab, p, chunk, trained=True)
        per_pass = head_chunk_positions(s.vocab, chunk)
        what_loss = f"chunks of {per_pass} positions" if chunk > 0 else "full logits"
        what_loss += f", up to {head_keep_positions(s.vocab, per_pass)} positions' logits kept" if chunk > 0 else ""
        accumulator = 0 if lora else head_accumulator_bytes(s.vocab, s.hidden, p, chunk)  # LoRA: the head is frozen
        loss += accumulator
        what_loss += ", the head gradient's float32 sum" if accumulator else ""

    what = "adapter " if lora else ""
    how = f"{'budget ' + str(budget) if budget else str(micro) + ' x ' + str(row)} tokens" + (
        f" / sp {sp}" if sp > 1 else ""
    )
    items = (
        Item("parameters", params * m // shards, not fsdp.param_offload, off, f"{_count(params)} x {cfg.model.dtype} / {shards} shards"),
        Item("gradients", trained * m // shards, False, off, f"{what}{_count(trained)} x {cfg.model.dtype} / {shards}"),
        Item("optimizer", 2 * trained * m // shards, not fsdp.optimizer_offload, off, "AdamW exp_avg + exp_avg_sq"),
        Item("optimizer step", trained * m // shards, False, off, "foreach AdamW's temporary"),
        Item("gathered units", gathered_bytes(s, fsdp, True, lora), False, False, f"in {fsdp.param_dtype}"),
        Item(
            "activations", activation_bytes(s, p, tokens, row, ckpt), False, False,
            f"micro-batch {how}, checkpointing {'on' if ckpt else 'off'}",
        ),
        Item("loss path", loss, False, False, what_loss),
    )  # fmt: skip
    variants = tuple((f"{'on' if c else 'off'}", activation_bytes(s, p, tokens, row, c) + loss) for c in (False, True))
    return RoleMemory(role, items, variants)


def _frozen(
    role: str, cfg: Config, plan: RunPlan, s: ModelShape, micro: int, row: int, offload: bool, head_chunk: int
) -> RoleMemory:
    """A frozen role (the reference: `row` = prompt + response, an LM head over chunks of `head_chunk` positions; the
    reward model: `row` = reward_model.max_length, a one-label head, `head_chunk` 0): its parameter shards and one
    micro-batch's no-grad forward."""
    fsdp, shards = plan.roles[role].fsdp, plan.roles[role].mesh_shape[-1]
    m, p = DTYPE_BYTES[cfg.model.dtype], DTYPE_BYTES[fsdp.param_dtype]
    tokens = micro * row // plan.roles[role].sequence_parallel
    forward = forward_bytes(s, p, tokens, row) + (loss_path_bytes(tokens, s.vocab, p, head_chunk) if head_chunk else 0)
    return RoleMemory(
        role,
        (
            Item("parameters", s.params * m // shards, True, offload, f"/ {shards}"),
            Item("gathered units", gathered_bytes(s, fsdp, False, False), False, False, f"in {fsdp.param_dtype}"),
            Item("forward", forward, False, False, f"micro-batch {tokens} tokens, no grad"),
        ),
    )


def _levers(cfg: Config, plan: RunPlan) -> dict[str, tuple[str, ...]]:
    a, more = cfg.actor, "more ranks (trainer.world_size / placement.*)"
    acts = [] if cfg.model.enable_gradient_checkpointing else ["model.enable_gradient_checkpointing=true"]
    acts += (
        [f"actor.ppo_max_token_len_per_gpu (now {a.ppo_max_token_len_per_gpu})"]
        if a.use_dynamic_bsz
        else [
            f"actor.ppo_micro_batch_size_per_gpu (now {a.ppo_micro_batch_size_per_gpu}) or actor.use_dynamic_bsz=true"
        ]
    )
    offload = [] if a.fsdp.offload_policy else ["actor.fsdp.offload_policy=true"]
    util = cfg.rollout.gpu_memory_utilization
    engine = [f"rollout.gpu_memory_utilization (now {util})"] if plan.placement.colocated["rollout"] and util else []
    hybrid = [f"actor.fsdp.{k}=true" for k in ("param_offload", "optimizer_offload") if not getattr(a.fsdp, k)]
    awake = [] if cfg.rollout.free_cache_engine else ["rollout.free_cache_engine=true"]
    share = [f"rollout.gpu_memory_utilization (now {util})"] if util else [*hybrid, *offload]
    return {
        "engine": (*share, "rollout.tensor_parallel_size", "rollout.dtype", "placement.rollout (ranks of its own)"),
        "generation": (*engine, *hybrid, *offload, more),
        "actor update": (*acts, *offload, *awake, more),
        "critic update": (
            f"critic.ppo_micro_batch_size_per_gpu (now {cfg.critic.ppo_micro_batch_size_per_gpu})",
            *([] if cfg.critic.fsdp.offload_policy else ["critic.fsdp.offload_policy=true"]),
            *awake,
            more,
        ),
        "reward_model forward": (
            f"reward_model.micro_batch_size_per_gpu (now {cfg.reward_model.micro_batch_size_per_gpu})",
            f"reward_model.max_length (now {cfg.reward_model.max_length})",
            *([] if cfg.reward_model.param_offload else ["reward_model.param_offload=true"]),
            *awake,
            more,
        ),
        "reference forward": (
            f"reference.log_prob_micro_batch_size_per_gpu (now {cfg.reference.log_prob_micro_batch_size_per_gpu})",
            *([] if cfg.reference.param_offload else ["reference.param_offload=true"]),
            *awake,
            more,
        ),
    }


def plan_memory(
    cfg: Config,
    plan: RunPlan,
    shape: ModelShape,
    device_type: str,
    card_bytes: int,
    loss_chunk_tokens: int = HEAD_CHUNK_TOKENS,
    critic_shape: ModelShape | None = None,
    reward_shape: ModelShape | None = None,
    judge_shape: ModelShape | None = None,
    teacher_shape: ModelShape | None = None,
) -> MemoryPlan:
    """Every rank's memory for `cfg` under `plan` on `card_bytes` of device memory (pure: no file, no device)."""
    roles_of: dict[int, list[str]] = {}
    for role, ranks in plan.placement.ranks.items():
        for rank in ranks:
            roles_of.setdefault(rank, []).append(role)
    memory: dict[str, RoleMemory] = {}
    if "actor" in plan.roles:
        memory["actor"] = _trained_role("actor", cfg, plan, shape, loss_chunk_tokens, False)
    if "critic" in plan.roles:
        memory["critic"] = _trained_role("critic", cfg, plan, critic_shape or shape, loss_chunk_tokens, True)
    if "reference" in plan.roles:
        ref, row = cfg.reference, cfg.data.max_prompt_length + cfg.data.max_response_length
        micro = ref.log_prob_micro_batch_size_per_gpu
        memory["reference"] = _frozen("reference", cfg, plan, shape, micro, row, ref.param_offload, loss_chunk_tokens)
    if "reward_model" in plan.roles:
        rm = cfg.reward_model
        memory["reward_model"] = _frozen(
            "reward_model", cfg, plan, reward_shape or shape, rm.micro_batch_size_per_gpu, rm.max_length,
            rm.param_offload, 0,
        )  # fmt: skip
    if "teacher" in plan.roles:  # the distillation teacher: the reference's forward over its own checkpoint
        t, row = cfg.distillation.teacher, cfg.data.max_prompt_length + cfg.data.max_response_length
        memory["teacher"] = _frozen(
            "teacher", cfg, plan, teacher_shape or shape, t.log_prob_micro_batch_size_per_gpu, row, t.param_offload,
            loss_chunk_tokens,
        )  # fmt: skip
    ro, row = cfg.rollout, plan.engine.max_model_len
    e, tp = DTYPE_BYTES[plan.engine.dtype], plan.tensor_parallel_size
    weights = shape.params * e // tp
    kv_needed = kv_cache_bytes(
        shape.layers, shape.kv_heads, shape.head_dim, e, ro.max_num_seqs, row, tensor_parallel_size=tp
    )

    judge_items: tuple[Item, ...] = ()
    judge_share = 0
    j = plan.judge_engine
    if j is not None and judge_shape is not None:  # a co-hosted judge: its own engine, built before the policy's
        jw = judge_shape.params * DTYPE_BYTES[j.dtype]
        jkv = kv_cache_bytes(
            judge_shape.layers, judge_shape.kv_heads, judge_shape.head_dim, DTYPE_BYTES[j.dtype],
            cfg.reward.judge.max_concurrency, j.max_model_len or judge_shape.positions,
        )  # fmt: skip
        if device_type == "cpu":
            judge_share = jw + min(jkv, ro.cpu_kvcache_space_gb * GiB)
        else:
            judge_share = int((j.gpu_memory_utilization or 0.0) * card_bytes)
        kv_room = judge_share - jw - (0 if device_type == "cpu" else ENGINE_RESERVE)
        judge_items = (
            Item("judge weights", jw, True, False, f"{j.dtype}, reward.judge.model"),
            Item("judge KV cache", min(jkv, max(kv_room, 0)), True, False, f"needs {_gib(jkv)}"),
        )

    def engine_share(trainer: tuple[RoleMemory, ...]) -> int:
        """vLLM's part of the device: rollout.gpu_memory_utilization x card, or (colocated, unset) the share of
        what the trainer and a co-hosted judge leave free when the engine starts, less the optimizer state still to
        come."""
        if device_type == "cpu":
            return weights + ro.cpu_kvcache_space_gb * GiB
        util = plan.engine.gpu_memory_utilization
        if util is not None:
            return int(util * card_bytes)
        loaded = sum(i.bytes for r in trainer for i in r.items if i.name == "parameters" and not i.on_host)
        later = sum(i.bytes for r in trainer for i in r.items if i.name == "optimizer" and i.resident and not i.on_host)
        return max(int(ENGINE_SHARE_OF_FREE * (card_bytes - loaded - later - judge_share)), 0)

    def engine(share: int) -> tuple[Item, ...]:
        kv = ro.cpu_kvcache_space_gb * GiB if device_type == "cpu" else share - weights - ENGINE_RESERVE
        how = f"{ro.max_num_seqs} sequences x {row} tokens"
        items = (
            Item("weights", weights, True, False, f"{plan.engine.dtype} / tensor_parallel_size {tp}"),
            Item("KV cache", min(kv_needed, max(kv, 0)), True, False, f"needs {_gib(kv_needed)} for {how}"),
        )
        if device_type == "cpu":
            return items
        graphs = "its CUDA graph pool and activation peak" if not plan.engine.enforce_eager else "its activation peak"
        return (*items, Item("graphs, activations", ENGINE_RESERVE, True, False, f"{graphs} (vLLM profiles them)"))

    by_roles: dict[tuple[str, ...], list[int]] = {}
    for rank in sorted(roles_of):
        by_roles.setdefault(tuple(roles_of[rank]), []).append(rank)
    groups = []
    for roles, ranks in by_roles.items():
        has_engine = "rollout" in roles and not plan.sft  # SFT builds no engine
        trainer = tuple(
            memory[r] for r in ("actor", "critic", "reference", "reward_model", "teacher") if r in roles and r in memory
        )
        share = engine_share(trainer) if has_engine else 0
        items = engine(share) if has_engine else ()
        groups.append(
            RankGroup(
                ranks=tuple(ranks),
                roles=trainer,
                engine=items + (judge_items if has_engine else ()),
                engine_share=share,
                engine_awake_in_update=has_engine and (device_type == "cpu" or plan.engine.sleep_level == 0),
                kv_needed=kv_needed if has_engine else 0,
                kv_available=items[1].bytes if has_engine else 0,
                judge_share=judge_share if has_engine else 0,
            )
        )
    return MemoryPlan(device_type, card_bytes, tuple(groups), _levers(cfg, plan))


def card_bytes(gpu_memory_gb: float | None, device_type: str, local_rank: int = 0, free: bool = False) -> int:
    """Device memory per rank: trainer.gpu_memory_gb, else the visible card's (`free`: what is free on it now, as a
    real run starts); host memory on CPU."""
    if device_type == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if gpu_memory_gb is not None:
        if gpu_memory_gb <= 0:
            raise ConfigError(f"trainer.gpu_memory_gb={gpu_memory_gb} must be > 0 (the card's memory in GiB)")
        return int(gpu_memory_gb * GiB)
    if not torch.cuda.is_available():
        raise ConfigError(
            "trainer.device=cuda without a visible GPU: set trainer.gpu_memory_gb to the card's memory in GiB "
            "(e.g. trainer.gpu_memory_gb=80) for the memory plan"
        )
    if free:
        return int(torch.cuda.mem_get_info(local_rank)[0])
    return int(torch.cuda.get_device_properties(local_rank).total_memory)


def memory_plan_for_run(
    cfg: Config, plan: RunPlan, device_type: str, local_rank: int = 0, free: bool = False
) -> MemoryPlan | None:
    """The memory plan from model.path's config.json (and the critic's); None without one (nothing to size). The dry
    run sizes the card; a real run (`free`) what is free on it as it starts."""
    card = card_bytes(cfg.trainer.gpu_memory_gb, device_type, local_rank, free)
    if not (Path(cfg.model.path) / "config.json").is_file():
        return None
    try:
        shape = model_shape(cfg.model)
        critic = cfg.critic.model.path
        critic_shape = reward_shape = None
        if "critic" in plan.roles and critic is not None:
            critic_shape = model_shape(_with_path(cfg.model, critic))
        if "reward_model" in plan.roles and cfg.reward_model.model.path is not None:
            from transformers import AutoModelForSequenceClassification

            rm_path = cfg.reward_model.model.path
            reward_shape = model_shape(_with_path(cfg.model, rm_path), AutoModelForSequenceClassification)
        teacher = cfg.distillation.teacher.path
        teacher_shape = model_shape(_with_path(cfg.model, teacher)) if "teacher" in plan.roles and teacher else None
        judge_shape = None
        if plan.judge_engine is not None:
            judge = cfg.reward.judge.model
            judge_shape = shape if judge == SELF_JUDGE else model_shape(_with_path(cfg.model, judge))
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path={cfg.model.path!r}: config.json cannot be read for the memory plan ({e})") from e
    return plan_memory(
        cfg, plan, shape, device_type, card, critic_shape=critic_shape, reward_shape=reward_shape,
        judge_shape=judge_shape, teacher_shape=teacher_shape,
    )  # fmt: skip


def _with_path(cfg: ModelConfig, path: str) -> ModelConfig:
    return replace(cfg, path=path, lora_rank=0)
