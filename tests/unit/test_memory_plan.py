"""Tests of torchrl_post/memory_plan.py: the estimates against the memory a tiny model measurably takes on CPU
(torch's MemTracker counts every live tensor storage; within 15%), the counts of a Qwen2.5-7B-shaped config, and
the one-line refusal of a config that cannot fit."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import Qwen2Config, Qwen2ForCausalLM

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import ModelConfig
from torchrl_post.memory_plan import (
    GiB,
    ModelShape,
    activation_bytes,
    card_bytes,
    forward_bytes,
    gathered_bytes,
    head_accumulator_bytes,
    loss_path_bytes,
    model_shape,
    plan_memory,
)
from torchrl_post.plan import plan_run
from torchrl_post.workers.lm_head import chunked_log_probs
from torchrl_post.workers.logprobs import head_keep_positions, logits_to_logprobs

QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
"""Qwen2.5-7B's shape (its config.json's keys that size it); no weights, no tokenizer."""

SEVEN_B_RUN = [
    "data.max_prompt_length=1024",
    "data.max_response_length=1024",
    "data.train_batch_size=64",
    "actor.ppo_mini_batch_size=16",
    "actor.ppo_micro_batch_size_per_gpu=4",
    "model.enable_gradient_checkpointing=true",
]
"""GRPO on 8 ranks with rollout.n=8: 4 samples of 2048 tokens per micro-batch; CUDA's defaults (bfloat16 compute
and engine over float32 master weights, the colocated engine sized from the memory the trainer leaves)."""

TINY = {"hidden": 128, "intermediate": 352, "layers": 4, "heads": 4, "kv_heads": 2, "vocab": 2048}


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def qwen7b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("qwen25_7b"), QWEN25_7B)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny_shape")
    _tiny_config().save_pretrained(out)
    return out


def _tiny_config() -> Qwen2Config:
    t = TINY
    return Qwen2Config(
        vocab_size=t["vocab"], hidden_size=t["hidden"], intermediate_size=t["intermediate"],
        num_hidden_layers=t["layers"], num_attention_heads=t["heads"], num_key_value_heads=t["kv_heads"],
        max_position_embeddings=256, tie_word_embeddings=False, attn_implementation="sdpa",
    )  # fmt: skip


def _tiny_model(dtype: torch.dtype) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(_tiny_config()).to(dtype)


def _peak(fn: Any, *external: Any, tracker: MemTracker | None = None) -> dict[str, int]:
    """Bytes by category (Parameter, Gradient, Optstate, Activation, Temp, Other, Total) at the peak of `fn()`."""
    tracker = tracker or MemTracker()
    tracker.track_external(*external)
    with tracker:
        fn()
    snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}


def _close(estimate: int, measured: int, what: str, within: float = 0.15) -> None:
    assert abs(estimate - measured) <= within * measured, f"{what}: estimated {estimate}, measured {measured}"


# ---- the model's shape ------------------------------------------------------------------------------------


def test_shape_of_qwen25_7b_from_config_json_alone(qwen7b_dir: Path) -> None:
    s = model_shape(ModelConfig(path=str(qwen7b_dir)))
    assert s.params == 7_615_616_512  # Qwen2.5-7B's published count
    # q, k, v (with biases), o, gate/up/down, two norms: by hand
    assert s.layer_params == (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    assert s.root_params == 2 * 152064 * 3584 + 3584 and s.head_params == 152064 * 3584
    assert (s.heads, s.kv_heads, s.head_dim, s.layers, s.adapter_params) == (28, 4, 128, 28, 0)


def test_adapter_count_matches_peft(tiny_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model

    s = model_shape(ModelConfig(path=str(tiny_dir), lora_rank=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    peft = get_peft_model(_tiny_model(torch.float32), LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    assert s.adapter_params == sum(p.numel() for p in peft.parameters() if p.requires_grad)
    everything = model_shape(ModelConfig(path=str(tiny_dir), lora_rank=4, target_modules="all-linear"))
    assert everything.adapter_params == 4 * 4 * (128 + 128 + 128 + 64 + 128 + 64 + 128 + 128) + 4 * 4 * 3 * (128 + 352)


# ---- estimates against measured peaks ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activations_of_a_tiny_model(tiny_dir: Path, dtype: torch.dtype, checkpointing: bool) -> None:
    """One micro-batch's forward and backward through the decoder (padded rows, as the trainer sends them)."""
    shape = model_shape(ModelConfig(path=str(tiny_dir)))
    model = _tiny_model(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    rows, row = 4, 64
    ids = torch.randint(0, TINY["vocab"], (rows, row))
    mask = torch.ones(rows, row, dtype=torch.long)
    mask[0, :5] = 0  # left padding: the mask sdpa gets is real

    def step() -> None:
        hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        hidden.float().pow(2).mean().backward()

    peak = _peak(step, model)
    measured = peak["Total"] - peak["Parameter"] - peak["Gradient"] - peak["Buffer"]
    p = torch.finfo(dtype).bits // 8
    _close(activation_bytes(shape, p, rows * row, row, checkpointing), measured, f"{dtype} ckpt={checkpointing}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_grad_forward_of_a_tiny_model(tiny_dir: Path, dtype: torch.dtype) -> None:
    """The reference's (and old logprobs') forward keeps nothing between layers."""
    shape, model = model_shape(ModelConfig(path=str(tiny_dir))), _tiny_model(dtype)
    ids, mask = torch.randint(0, TINY["vocab"], (4, 64)), torch.ones(4, 64, dtype=torch.long)
    mask[0, :5] = 0

    def forward() -> None:
        with torch.no_grad():
            model.model(input_ids=ids, attention_mask=mask, use_cache=False)

    peak = _peak(forward, model)
    measured = peak["Total"] - peak["Parameter"] - peak["Buffer"]
    _close(forward_bytes(shape, torch.finfo(dtype).bits // 8, 4 * 64, 64), measured, f"no-grad forward {dtype}")


@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_path_chunked(dtype: torch.dtype, trained: bool) -> None:
    """The chunked head's logprobs and entropy, forward and backward, from the hidden states: the peak less the
    hidden states, the head's weight and their gradients; `trained`, with the logits the forward keeps for the
    backward (here all four chunks)."""
    positions, hidden, vocab, chunk = 1024, 64, 4096, 256
    h = torch.randn(positions, hidden, dtype=dtype, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (positions,))

    def step() -> None:
        keep = head_keep_positions(vocab, chunk) if trained else 0
        logp, ent = chunked_log_probs(h, w, None, labels, 0.7, chunk=chunk, keep=keep)
        (logp.sum() + 0.01 * ent.sum()).backward()

    measured = _peak(step, h, w)["Total"] - 2 * (h.nbytes + w.nbytes)
    p = torch.finfo(dtype).bits // 8
    estimate = loss_path_bytes(positions, vocab, p, chunk, trained) + head_accumulator_bytes(vocab, hidden, p, chunk)
    _close(estimate, measured, f"chunked loss path {dtype}", within=0.05)  # bf16: 9% under without the float32 sum


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_path_full_logits(dtype: torch.dtype) -> None:
    """A head the chunked pass cannot take (HEAD_CHUNK_TOKENS 0): the full logits, then `logits_to_logprobs`."""
    positions, vocab = 256, 4096
    logits = torch.randn(1, positions, vocab, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (1, positions))

    def step() -> None:
        logp, ent = logits_to_logprobs(logits, labels, 0.7)
        (logp.sum() + 0.01 * ent.sum()).backward()

    measured = _peak(step, logits)["Total"]
    p = torch.finfo(dtype).bits // 8
    _close(loss_path_bytes(positions, vocab, p, chunk_tokens=0), measured, f"full-logits loss path {dtype}")


def test_parameters_gradients_and_adamw_on_one_rank(tiny_dir: Path) -> None:
    cfg = load_config([f"model.path={tiny_dir}", "data.train_batch_size=4", "rollout.n=2"])
    plan = plan_run(cfg, 1)
    items = {i.name: i.bytes for i in _actor(plan_memory(cfg, plan, model_shape(cfg.model), "cpu", 64 * GiB))}
    model = _tiny_model(torch.float32)
    # foreach: the default for GPU tensors (CPU tensors default to a loop over parameters, a smaller peak)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    ids = torch.randint(0, TINY["vocab"], (2, 16))
    after: dict[str, int] = {}

    def step() -> None:
        model(input_ids=ids).logits.float().mean().backward()
        optimizer.step()
        snap = tracker.get_tracker_snapshot("current")[torch.device("cpu")]
        after.update({str(getattr(k, "value", k)): int(v) for k, v in snap.items()})

    tracker = MemTracker()
    peak = _peak(step, model, optimizer, tracker=tracker)
    _close(items["parameters"], peak["Parameter"], "parameters")
    _close(items["gradients"], peak["Gradient"], "gradients")
    _close(items["optimizer"], after["Optstate"], "AdamW state")
    _close(items["optimizer"] + items["optimizer step"], peak["Optstate"], "AdamW state at the step's peak")


@pytest.mark.parametrize(("param_dtype", "p"), [("float32", 4), ("bfloat16", 2)])
def test_actor_update_counts_the_head_gradient_float32_sum(tiny_dir: Path, param_dtype: str, p: int) -> None:
    """The chunked head's backward sums a bfloat16 head weight's gradient in a float32 [V, H]: the actor's loss path
    grows by V h 4 bytes over the chunks' logits; a float32 weight's gradient is summed in place, no growth."""
    overrides = ["data.train_batch_size=4", "rollout.n=2", f"actor.fsdp.param_dtype={param_dtype}"]
    cfg = load_config([f"model.path={tiny_dir}", *overrides])
    plan = plan_run(cfg, 1)
    assert plan.roles["actor"].fsdp.param_dtype == param_dtype
    loss = {i.name: i.bytes for i in _actor(plan_memory(cfg, plan, model_shape(cfg.model), "cpu", 64 * GiB))}
    positions = plan.roles["actor"].micro_batch_samples * cfg.data.max_response_length
    grown = loss["loss path"] - loss_path_bytes(positions, TINY["vocab"], p, trained=True)
    assert grown == (TINY["vocab"] * TINY["hidden"] * 4 if p == 2 else 0)


def _actor(memory: Any) -> Any:
    return next(r for g in memory.groups for r in g.roles if r.role == "actor").items


# ---- the plan for 7B on 8 x 80 GiB, and refusals ----------------------------------------------------------


def _seven_b(qwen7b_dir: Path, *overrides: str) -> tuple[Any, Any, ModelShape]:
    cfg = load_config([f"model.path={qwen7b_dir}", *SEVEN_B_RUN, *overrides])
    return cfg, plan_run(cfg, 8, "cuda"), model_shape(cfg.model)


def test_seven_b_on_eight_cards_fits(qwen7b_dir: Path) -> None:
    cfg, plan, shape = _seven_b(qwen7b_dir)
    memory = plan_memory(cfg, plan, shape, "cuda", 80 * GiB)
    memory.check()
    items = {i.name: i for i in _actor(memory)}
    assert items["parameters"].bytes == 7_615_616_512 * 4 // 8  # float32 master weights over 8 shards
    assert items["optimizer"].bytes == 2 * items["parameters"].bytes
    (group,) = memory.groups
    resident = items["parameters"].bytes + items["optimizer"].bytes
    # rollout.gpu_memory_utilization unset: the engine takes 0.9 of what the trainer leaves (engines/vllm.py sizes it so)
    assert group.ranks == tuple(range(8)) and group.engine_share == int(0.9 * (80 * GiB - resident))
    assert group.phases()["generation"] == resident + group.engine_share
    text = memory.describe()
    for needle in ("ranks 0-7: actor + rollout", "actor activations", "engine KV cache", "peak by phase"):
        assert needle in text, text


@pytest.mark.parametrize("tp", [1, 2])
def test_kv_cache_counted_as_the_engine_asks_for_it(tiny_dir: Path, tp: int) -> None:
    """One formula: the memory plan's KV need is the cap the engine sets on the same model config (72-token rows in
    whole blocks of 128, and vLLM's null block), on each tensor-parallel rank its share of the kv heads."""
    from transformers import AutoConfig

    from torchrl_post.engines.base import kv_cache_need

    cfg = load_config([f"model.path={tiny_dir}", "rollout.max_num_seqs=3", f"rollout.tensor_parallel_size={tp}"])
    plan = plan_run(cfg, 2)
    (group,) = plan_memory(cfg, plan, model_shape(cfg.model), "cpu", 64 * GiB).groups
    asked = kv_cache_need(AutoConfig.from_pretrained(tiny_dir), 4, 3, 72, tensor_parallel_size=tp)
    assert plan.engine.max_model_len == 72 and asked == 2 * 4 * (2 // tp) * 32 * 4 * (3 + 1) * 128
    assert group.kv_needed == asked


@pytest.mark.parametrize(
    ("overrides", "card_gib", "needle"),
    [
        ((), 8, "in the generation (actor parameters 3.55, actor optimizer 7.09, engine share 0.00)"),
        (("rollout.gpu_memory_utilization=0.5",), 8, "change one of: rollout.gpu_memory_utilization (now 0.5)"),
        (
            ("model.enable_gradient_checkpointing=false", "actor.ppo_micro_batch_size_per_gpu=8"),
            80,
            "actor update",
        ),
        (("actor.fsdp.offload_policy=true", "rollout.gpu_memory_utilization=0.1"), 80, "engine's weights"),
    ],
)
def test_impossible_configs_are_refused_in_one_line(
    qwen7b_dir: Path, overrides: tuple[str, ...], card_gib: int, needle: str
) -> None:
    cfg, plan, shape = _seven_b(qwen7b_dir, *overrides)
    with pytest.raises(ConfigError) as info:
        plan_memory(cfg, plan, shape, "cuda", card_gib * GiB).check()
    msg = str(info.value)
    assert "\n" not in msg and needle in msg, msg
    # The same config on CPU prints its plan and refuses nothing.
    plan_memory(cfg, plan, shape, "cpu", card_gib * GiB).check()


def test_checkpointing_off_names_it(qwen7b_dir: Path) -> None:
    cfg, plan, shape = _seven_b(qwen7b_dir, "model.enable_gradient_checkpointing=false")
    with pytest.raises(
        ConfigError, match="model.enable_gradient_checkpointing=true, actor.ppo_micro_batch_size_per_gpu"
    ):
        plan_memory(cfg, plan, shape, "cuda", 40 * GiB).check()


def test_card_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert card_bytes(80, "cuda") == 80 * GiB and card_bytes(None, "cpu") > 0
    with pytest.raises(ConfigError, match="set trainer.gpu_memory_gb to the card's memory in GiB"):
        card_bytes(None, "cuda")
    with pytest.raises(ConfigError, match="trainer.gpu_memory_gb=0 must be > 0"):
        card_bytes(0, "cuda")


def test_the_colocated_engines_reserve_is_every_trained_roles_pending_state_as_planned(tiny_dir: Path) -> None:
    """PPO with the critic beside the actor and the engine (finding 2 of issue 36): the engine starts before the
    first step, so it must leave both roles' AdamW state free, as the memory plan counts it; the actor's alone
    would put a 7B PPO run 0.2-0.5 GiB over an 80 GB card at the first update."""
    from transformers import Qwen2ForTokenClassification

    from torchrl_post.workers.optim import pending_optimizer_bytes

    cfg = load_config([f"model.path={tiny_dir}", "data.train_batch_size=4", "rollout.n=2"])
    cfg.algorithm.adv_estimator = "gae"
    plan = plan_run(cfg, 1, "cuda")
    memory = plan_memory(cfg, plan, model_shape(cfg.model), "cuda", 80 * GiB)
    (group,) = memory.groups
    planned = {
        r.role: next(i.bytes for i in r.items if i.name == "optimizer") for r in group.roles if r.role != "reference"
    }
    assert set(planned) == {"actor", "critic"}
    actor = _tiny_model(torch.float32)
    critic_config = _tiny_config()
    critic_config.num_labels = 1
    critic = Qwen2ForTokenClassification(critic_config)
    reserve = pending_optimizer_bytes(actor, on_host=False) + pending_optimizer_bytes(critic, on_host=False)
    _close(planned["actor"] + planned["critic"], reserve, "the engine's reserve")
    assert reserve > 1.5 * pending_optimizer_bytes(actor, on_host=False)  # the critic's share counted
    assert pending_optimizer_bytes(actor, on_host=True) == 0  # optimizer state on the host: nothing to leave


def test_a_real_cuda_run_refuses_at_start_what_its_dry_run_refuses(qwen7b_dir: Path) -> None:
    """api.check_memory, the real run's check before any model loads, on a CUDA rank (its env; the card's memory
    from trainer.gpu_memory_gb: none is visible here) refuses the 7B run on 8 GiB with the dry run's line, and
    trainer.memory_check=false lets it start."""
    from torchrl_post.api import check_memory
    from torchrl_post.distributed.env import DistEnv

    cfg, plan, shape = _seven_b(qwen7b_dir, "trainer.gpu_memory_gb=8")
    rank = DistEnv(0, 8, 0, 8, torch.device("cuda", 0), "cpu:gloo,cuda:nccl")
    with pytest.raises(ConfigError) as real:
        check_memory(cfg, plan, rank)
    with pytest.raises(ConfigError) as dry:
        plan_memory(cfg, plan, shape, "cuda", 8 * GiB).check()
    assert str(real.value) == str(dry.value) and "\n" not in str(real.value)
    cfg.trainer.memory_check = False
    check_memory(cfg, plan, rank)
    cpu = DistEnv(0, 8, 0, 8, torch.device("cpu"), "gloo")
    check_memory(_seven_b(qwen7b_dir, "trainer.gpu_memory_gb=8")[0], plan, cpu)  # host memory: not planned


def test_a_wide_vocabulary_bounds_the_heads_chunk_in_bytes() -> None:
    """Issue 36 item 6: 1024 positions of Qwen's 151,936-token vocabulary are 0.62 GB per float32 [chunk x V]
    tensor (a 4-sample step at 384 response tokens peaked 0.91 GB above one at 64 in the whole process); the
    chunk is bounded by HEAD_CHUNK_BYTES. Measured: the logprob pass of 1536 positions through a real model of
    that vocabulary stays within the plan's loss path, a few of those 64 MiB tensors."""
    from tests.unit.batch_helpers import _prompts
    from torchrl_post.engines.batch import collate
    from torchrl_post.types import Generation
    from torchrl_post.workers.logprobs import HEAD_CHUNK_BYTES, forward_log_probs, head_chunk_positions
    from torchrl_post.workers.micro_batches import plan_micro_batches

    qwen = 151_936
    assert head_chunk_positions(qwen) == HEAD_CHUNK_BYTES // (4 * qwen) == 110
    assert head_chunk_positions(128) == 1024 and head_chunk_positions(qwen, 0) == 0  # small heads, full logits
    cfg = Qwen2Config(
        vocab_size=qwen, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = _prompts([torch.randint(0, qwen, (16,), generator=gen).tolist()], [0])
    responses = [torch.randint(0, qwen, (384,), generator=gen).tolist() for _ in range(4)]
    batch = collate(prompts, Generation(responses, [[0.0] * 384] * 4, ["length"] * 4), n=4, pad_id=0)
    (mb,) = plan_micro_batches(batch.attention_mask, batch.response_width, 4, 0, False, None, torch.device("cpu"))

    def forward() -> None:
        with torch.no_grad():
            forward_log_probs(model, batch, mb, 1.0, torch.device("cpu"), False)

    measured = _peak(forward, model)["Total"] - sum(p.nbytes for p in model.parameters())
    planned = loss_path_bytes(4 * 384, qwen, 4)
    assert measured < planned + (32 << 20), f"measured {measured / 2**20:.0f} MiB, planned {planned / 2**20:.0f} MiB"
    assert measured < 300 << 20  # 1024-position chunks: 1.9 GB


def test_the_engine_on_cuda_counts_its_graph_pool(qwen7b_dir: Path) -> None:
    cfg, plan, shape = _seven_b(qwen7b_dir)
    (group,) = plan_memory(cfg, plan, shape, "cuda", 80 * GiB).groups
    items = {i.name: i for i in group.engine}
    assert items["graphs, activations"].bytes == GiB and "CUDA graph pool" in items["graphs, activations"].note
    assert sum(i.bytes for i in group.engine) <= group.engine_share  # within the share vLLM is given


def test_a_co_hosted_judge_takes_its_share_first_in_every_phase(qwen7b_dir: Path) -> None:
    """A 7B judge beside the 7B policy on 80 GiB: its engine (reward.judge.gpu_memory_utilization of the card, never
    asleep) is counted in every phase, and the colocated policy engine sizes itself from what is left after it."""
    judge = ["reward.judge.enable=true", f"reward.judge.model={qwen7b_dir}", "reward.judge.max_model_len=4096"]
    cfg, plan, shape = _seven_b(qwen7b_dir, *judge)
    alone = plan_memory(*_seven_b(qwen7b_dir)[:2], shape, "cuda", 80 * GiB).groups[0]
    (group,) = plan_memory(cfg, plan, shape, "cuda", 80 * GiB, judge_shape=shape).groups
    share = int(0.2 * 80 * GiB)
    assert group.judge_share == share and alone.judge_share == 0
    # the policy's engine: 0.9 of what the trainer leaves, less the judge's share taken before it
    assert abs(group.engine_share - (alone.engine_share - 0.9 * share)) <= 1
    resident = alone.phases()["generation"] - alone.engine_share
    assert group.phases()["generation"] == resident + share + group.engine_share
    assert all(peak >= resident + share for peak in group.phases().values())
    items = {i.name: i for i in group.engine}
    assert items["judge weights"].bytes == 7_615_616_512 * 2  # bfloat16, whole on each rank
    # K and V, 28 layers x 4 kv heads x 128 dims x 2 bytes, 16 sequences of 4096 tokens and vLLM's null block
    kv = 2 * 28 * 4 * 128 * 2 * (16 * 4096 + 128)
    assert items["judge KV cache"].bytes == min(kv, share - items["judge weights"].bytes - GiB)


def test_a_teacher_is_counted_beside_the_student_and_sft_counts_no_engine(qwen7b_dir: Path, tiny_dir: Path) -> None:
    """Distillation: a 7B teacher beside a small student on 8 cards holds its bfloat16 shards (frozen: no gradient,
    no optimizer state) and its forward phase; SFT's ranks hold no engine and have no generation phase."""
    student = model_shape(ModelConfig(path=str(tiny_dir)))
    cfg = load_config(
        [f"model.path={tiny_dir}", *SEVEN_B_RUN, "distillation.enable=true", f"distillation.teacher.path={qwen7b_dir}"]
    )
    plan = plan_run(cfg, 8, "cuda")
    teacher = model_shape(ModelConfig(path=str(qwen7b_dir)))
    (group,) = plan_memory(cfg, plan, student, "cuda", 80 * GiB, teacher_shape=teacher).groups
    roles = {r.role: r for r in group.roles}
    items = {i.name: i for i in roles["teacher"].items}
    assert items["parameters"].bytes == 7_615_616_512 * 4 // 8  # model.dtype float32 shards over the 8 ranks
    assert "gradients" not in items and "optimizer" not in items
    assert "teacher forward" in group.phases()
    sft = load_config([f"model.path={tiny_dir}", *SEVEN_B_RUN, "sft.enable=true"])
    (only,) = plan_memory(sft, plan_run(sft, 8, "cuda"), student, "cuda", 80 * GiB).groups
    assert not only.engine and only.engine_share == 0 and "generation" not in only.phases()


def cfg_overrides(model: Path) -> list[str]:
    return [f"model.path={model}", "data.train_batch_size=4", "rollout.n=2"]


def test_expert_parallelism_gathers_a_ranks_share_of_the_experts(tiny_moe_model: Path) -> None:
    """The tiny Qwen3-MoE's routed experts per layer (4 experts: gate_up [4, 128, 64] and down [4, 64, 64], counted
    by hand) and the gathered units' bytes at ep 2 against ep 1: each of the 3 layer-sized terms (a layer gathered,
    the next prefetched, a layer's gradient) holds half of the experts."""
    cfg = load_config(cfg_overrides(tiny_moe_model))
    shape = model_shape(cfg.model)
    assert shape.expert_layer_params == 4 * 128 * 64 + 4 * 64 * 64
    fsdp = replace(cfg.actor.fsdp, param_dtype="float32")  # the plan resolves auto by the device: float32 on CPU
    one = gathered_bytes(shape, fsdp, True, False)
    two = gathered_bytes(shape, replace(fsdp, expert_parallel_size=2), True, False)
    assert one - two == 3 * (shape.expert_layer_params // 2) * 4
    items = {i.name: i.bytes for i in _actor(plan_memory(cfg, plan_run(cfg, 2), shape, "cpu", 64 * GiB))}
    ep_cfg = load_config([*cfg_overrides(tiny_moe_model), "actor.fsdp.expert_parallel_size=2"])
    ep_items = {i.name: i.bytes for i in _actor(plan_memory(ep_cfg, plan_run(ep_cfg, 2), shape, "cpu", 64 * GiB))}
    assert items["gathered units"] - ep_items["gathered units"] == one - two
    assert items["parameters"] == ep_items["parameters"]  # the shards: every expert over all ranks either way
