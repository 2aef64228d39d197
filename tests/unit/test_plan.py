"""Tests of torchrl_post/plan.py: the run plan over a table of configs, each row's answers worked out by hand."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from torchrl_post.algos.rollout_correction import RolloutCorrection
from torchrl_post.algos.sampling_support import Truncation
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.plan import RunPlan, engine_spec, plan_run, planned_world, rollout_correction

AGENT = ["agent.env=torchrl_post.agent.math_agent:MathEnv", "agent.agent=torchrl_post.agent.math_agent:ToolAgent"]

# (name, world, overrides, expected answers). Demo defaults: 16 prompts x n=8, ppo_mini_batch_size 0 (= the
# batch), micro 32, ppo_epochs 1, sync_bucket_mb 64, rollout_correction.rollout_is auto with threshold 2.0.
TABLE: list[tuple[str, int, list[str], dict[str, Any]]] = [
    (
        "colocated on 2 ranks",
        2,
        [],
        {
            "roles": {"actor": ([0, 1], ("dp",), (2,), 64)},  # 16*8 samples / 2 ranks, one mini-batch
            "rollout_ranks": [0, 1],
            "engines": 2,
            "sync": "reload",
            "reference": "none",
            "critic": "none",
            "lora_sync": "none",
            "needs_old_log_probs": False,
            "rollout_correction": RolloutCorrection(),
            "group_size": 8,
            "micro_batch_samples": 32,
        },
    ),
    (
        "rollout ranks of their own, look-ahead 1",
        4,
        ["placement.actor=[0,1]", "placement.rollout=[2,3]", "trainer.max_off_policy_steps=1"],
        {
            "roles": {"actor": ([0, 1], ("dp",), (2,), 64)},
            "rollout_ranks": [2, 3],
            "engines": 2,
            "sync": "broadcast",
            "needs_old_log_probs": False,  # one update per batch: the actor's forward is the old policy
            "rollout_correction": RolloutCorrection("token"),  # auto: on with look-ahead
            "max_off_policy_steps": 1,
        },
    ),
    (
        "tensor-parallel engines",
        4,
        ["placement.actor=[0,1]", "placement.rollout=[2,3]", "rollout.tensor_parallel_size=2"],
        {"engines": 1, "rollout_ranks": [2, 3], "tensor_parallel_size": 2, "sync": "broadcast"},
    ),
    (
        "HSDP: fsdp_size 2 of 4 actor ranks, mini-batches of 4 prompts, 2 epochs",
        4,
        ["actor.fsdp.fsdp_size=2", "actor.ppo_mini_batch_size=4", "actor.ppo_epochs=2"],
        {
            "roles": {"actor": ([0, 1, 2, 3], ("dp_replicate", "dp_shard"), (2, 2), 8)},  # 4*8 samples / 4 ranks
            "needs_old_log_probs": True,  # several updates per batch
            "micro_batch_samples": 8,  # the mini-batch is smaller than the micro-batch size
            "mini_batch_prompts": 4,
        },
    ),
    (
        "GAE critic and KL reference on ranks of their own",
        4,
        [
            "algorithm.adv_estimator=gae",
            "actor.use_kl_loss=true",
            "placement.actor=[0,1]",
            "placement.critic=[2]",
            "placement.reference=[3]",
        ],
        {
            "roles": {
                "actor": ([0, 1], ("dp",), (2,), 64),
                "critic": ([2], ("dp",), (1,), 128),
                "reference": ([3], ("dp",), (1,), 128),
            },
            "critic": "own_ranks",
            "reference": "own_ranks",
            "sync": "reload",  # the rollout stays with the actor
        },
    ),
    (
        "KL in the reward: a colocated reference placed by the plan, old logprobs for the penalty",
        2,
        ["algorithm.use_kl_in_reward=true"],
        {"reference": "colocated", "needs_old_log_probs": True, "notes": 1},
    ),
    (
        "LoRA with a KL loss: the actor with its adapter off is the reference, adapter sync",
        2,
        ["model.lora_rank=8", "actor.use_kl_loss=true", "rollout.lora_sync=adapter", "placement.reference=actor"],
        {
            "reference": "adapter_off",
            "lora_sync": "adapter",
            "notes": 1,
            "roles": {"actor": ([0, 1], ("dp",), (2,), 64)},
        },
    ),
    (
        "LoRA merged into the engine's weights",
        1,
        ["model.lora_rank=8", "rollout.sync_bucket_mb=4"],
        {"lora_sync": "merged", "reference": "none", "sync_bucket_bytes": 4 << 20},
    ),
    ("a group's n samples of one prompt: prefix caching in the engine", 1, [], {"engine_prefix_caching": True}),
    (
        "one sample per prompt, no agent: no prefix caching",
        1,
        ["rollout.n=1", "algorithm.adv_estimator=gae"],
        {"engine_prefix_caching": False},
    ),
    (
        "agents: prefix caching in the engine",
        2,
        AGENT,
        {"engine_prefix_caching": True, "engine_max_model_len": 64 + 8},
    ),
    (
        "token-level importance sampling forced on, colocated (the keys before rollout_correction)",
        1,
        ["algorithm.rollout_is=token", "algorithm.rollout_is_threshold=3.0"],
        {"rollout_correction": RolloutCorrection("token", 3.0, None, 3.0, 1 / 3), "masked_reasons": ()},
    ),
    (
        "sequence-level weights and geometric rejection: the rejection needs the old logprobs before the update",
        1,
        [
            "algorithm.rollout_correction.rollout_is=sequence",
            "algorithm.rollout_correction.rollout_rs=geometric",
            "algorithm.rollout_correction.rollout_rs_threshold=1.001",
            "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4",
        ],
        {
            "rollout_correction": RolloutCorrection("sequence", 2.0, "geometric", 1.001, 1 / 1.001, 1e-4),
            "needs_old_log_probs": True,
            "notes": 0,
        },
    ),
    (
        "token rejection with a band of its own, weights off",
        1,
        [
            "algorithm.rollout_correction.rollout_is=null",
            "algorithm.rollout_correction.rollout_rs=token",
            "algorithm.rollout_correction.rollout_rs_threshold=4.0",
            "algorithm.rollout_correction.rollout_rs_threshold_lower=0.1",
        ],
        {"rollout_correction": RolloutCorrection(None, 2.0, "token", 4.0, 0.1), "needs_old_log_probs": True},
    ),
    (
        "weights alone need no old logprobs on-policy (the update's own are the old policy's)",
        1,
        ["algorithm.rollout_correction.rollout_is=sequence"],
        {"rollout_correction": RolloutCorrection("sequence"), "needs_old_log_probs": False},
    ),
    (
        "compact filtering masks overlong and errored samples, not env_done",
        1,
        ["algorithm.compact_filtering.enable=true"],
        {"masked_reasons": ("max_prompt_length", "length", "max_turns", "timeout", "error")},
    ),
]


def _answers(plan: RunPlan) -> dict[str, Any]:
    return {
        "roles": {
            role: (list(r.ranks), r.mesh_dims, r.mesh_shape, r.mini_batch_samples) for role, r in plan.roles.items()
        },
        "rollout_ranks": plan.rollout_ranks,
        "engines": plan.engines,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "sync": plan.sync,
        "sync_bucket_bytes": plan.sync_bucket_bytes,
        "reference": plan.reference,
        "critic": plan.critic,
        "lora_sync": plan.lora_sync,
        "needs_old_log_probs": plan.needs_old_log_probs,
        "rollout_correction": plan.rollout_correction,
        "group_size": plan.group_size,
        "micro_batch_samples": plan.roles["actor"].micro_batch_samples,
        "mini_batch_prompts": plan.mini_batch_prompts,
        "max_off_policy_steps": plan.max_off_policy_steps,
        "notes": len(plan.notes),
        "engine_prefix_caching": plan.engine.prefix_caching,
        "engine_max_model_len": plan.engine.max_model_len,
        "masked_reasons": plan.masked_reasons,
    }


@pytest.mark.parametrize("name,world,overrides,expected", TABLE, ids=[row[0] for row in TABLE])
def test_plan_answers(name: str, world: int, overrides: list[str], expected: dict[str, Any]) -> None:
    cfg = load_config(overrides)
    before = copy.deepcopy(cfg)
    got = _answers(plan_run(cfg, world))
    for key, want in expected.items():
        if key == "roles":
            for role, answer in want.items():
                assert got["roles"][role] == answer, (role, got["roles"])
            assert sorted(got["roles"]) == sorted(want), got["roles"]
        else:
            assert got[key] == want, (key, got[key])
    assert cfg == before, "planning must not change the config"


def test_the_plan_places_roles_without_touching_placement() -> None:
    cfg = load_config(["algorithm.adv_estimator=gae", "placement.reference=actor"])
    plan = plan_run(cfg, 2)
    assert plan.critic == "colocated" and "critic" in plan.placement.ranks
    assert plan.reference == "none" and "reference" not in plan.placement.ranks  # no KL term uses it
    assert cfg.placement.critic is None and cfg.placement.reference == "actor"
    assert [n.split(":")[0] for n in plan.notes] == ["placement.critic", "placement.reference='actor' ignored"]


def test_engine_spec_outside_training_reads_weights() -> None:
    cfg = load_config(["rollout.load_format=dummy"])
    assert engine_spec(cfg).load_format == "auto"  # nobody pushes weights before a test's or benchmark's engine
    assert plan_run(cfg, 1).engine.load_format == "dummy"  # the training loop syncs first


def test_partial_rollouts_turn_the_engines_async_scheduling_off() -> None:
    """Weights that load while requests run: no step may be scheduled ahead of the load (vLLM's async scheduling,
    on by default on CUDA, would sample a token per running request with the old weights, labelled new)."""
    streaming = plan_run(load_config(["rollout.partial_rollout=true"]), 2, "cuda").engine
    assert streaming.updates_in_flight and streaming.scheduler_options() == {"async_scheduling": False}
    whole = plan_run(load_config([]), 2, "cuda").engine
    assert not whole.updates_in_flight and whole.scheduler_options() == {}  # vLLM's default


def test_the_experts_come_from_vllm_on_cuda_and_from_the_router_hook_on_cpu() -> None:
    """Finding 1 of issue 36: on CUDA vLLM 0.32 runs its model runner V2 (no `input_batch` for the hook to read) and
    CUDA graphs skip the hook inside the compiled MoE op; vLLM's own capture is right there, the hook on CPU."""
    cfg = load_config(["actor.router_replay=true"])
    cuda, cpu = plan_run(cfg, 2, "cuda").engine, plan_run(cfg, 2, "cpu").engine
    assert cuda.record_routes and cuda.routes_from_engine
    assert cpu.record_routes and not cpu.routes_from_engine
    assert "records them (vLLM)" in plan_run(cfg, 2, "cuda").describe("cuda", "nccl")
    off = plan_run(load_config(["rollout.return_routed_experts=false"]), 2, "cuda").engine
    assert not off.record_routes and not off.routes_from_engine


def test_vllms_record_of_a_requests_experts_is_cut_to_the_positions_the_sample_needs() -> None:
    import numpy as np

    from torchrl_post.engines.vllm import engine_routes

    routed = np.arange(5 * 2 * 3).reshape(5, 2, 3).astype(np.int32)  # [positions, layers, k]
    got = engine_routes(routed, "r0", 4)
    assert got.dtype == torch.int64 and got.shape == (4, 2, 3) and got.tolist() == routed[:4].tolist()
    with pytest.raises(RuntimeError, match="vLLM returned none for request r1, 4 needed"):
        engine_routes(None, "r1", 4)


def test_total_steps_from_data_size() -> None:
    plan = plan_run(load_config(["trainer.total_epochs=2", "trainer.total_training_steps=null"]), 1)
    assert plan.total_steps(100) == 12  # 6 batches per epoch (the last partial one dropped), 2 epochs
    assert plan_run(load_config(["trainer.total_training_steps=5"]), 1).total_steps(100) == 5
    with pytest.raises(ConfigError, match="data.train_batch_size=16 is larger than the 10 training prompts"):
        plan.total_steps(10)


@pytest.mark.parametrize(
    "world,overrides,needle",
    [
        (3, [], "data.train_batch_size=16 is not divisible by the 3 actor ranks"),
        (2, ["placement.actor=[0]", "placement.rollout=[1]", "rollout.tensor_parallel_size=2"], "does not divide"),
        (2, ["trainer.max_off_policy_steps=1"], "needs the rollout on ranks of its own"),
        (4, ["actor.fsdp.fsdp_size=3"], "actor.fsdp.fsdp_size=3 does not divide the 4 actor ranks"),
        (2, ["rollout.engine=hf", "placement.actor=[0]", "placement.rollout=[1]"], "rollout.engine=hf runs on"),
        (
            8,
            ["actor.ppo_mini_batch_size=2", "rollout.n=2"],
            "actor.ppo_mini_batch_size=2 x rollout.n=2 = 4 samples per optimizer step is not divisible by the 8 actor",
        ),
        (
            4,
            ["model.ulysses_sequence_parallel_size=3"],
            "model.ulysses_sequence_parallel_size=3 does not divide the 4 actor ranks [0, 1, 2, 3]",
        ),
        (
            4,
            ["model.ulysses_sequence_parallel_size=2", "actor.fsdp.fsdp_size=1"],
            "model.ulysses_sequence_parallel_size=2 does not divide actor.fsdp.fsdp_size=1",
        ),
        (
            6,
            [
                "model.ulysses_sequence_parallel_size=2",
                "algorithm.adv_estimator=gae",
                "placement.actor=[0,1,2,3]",
                "placement.rollout=[5]",
                "placement.critic=[4]",
            ],  # fmt: skip
            "model.ulysses_sequence_parallel_size=2 does not divide the 1 critic ranks [4]",
        ),
        (4, ["model.ulysses_sequence_parallel_size=0"], "model.ulysses_sequence_parallel_size=0 must be > 0"),
    ],
)
def test_plan_errors_are_one_line(world: int, overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_run(load_config(overrides), world)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_planned_world() -> None:
    assert planned_world(None, 3, True) == 3
    assert planned_world(8, 1, False) == 8
    with pytest.raises(ConfigError, match="torchrun started 2 processes"):
        planned_world(4, 2, True)


def test_describe_shows_every_decision() -> None:
    cfg = load_config(["placement.actor=[0,1]", "placement.rollout=[2,3]", "actor.fsdp.fsdp_size=1"])
    text = plan_run(cfg, 4).describe("cpu", "gloo")
    for line in (
        "actor mesh ('dp_replicate', 'dp_shard') = (2, 1) (HSDP)",
        "rollout engines (vllm, tensor_parallel_size=1): [[2], [3]]",
        "weight sync: broadcast, buckets of 64 MiB",
        "group size: 8; old logprobs: no",
        "reference: none; critic: none; reward model: none; lora sync: none",
        "training reward: 1 x rule",
        "samples_per_mini_batch_per_rank: 64",
    ):
        assert line in text, (line, text)


def test_batch_numbers_per_rank() -> None:
    plan = plan_run(load_config(["placement.actor=[0,1]", "placement.rollout=[2,3]"]), 4)
    assert plan.batch_numbers() == {
        "prompts_per_step": 16,
        "samples_per_step": 128,
        "prompts_per_rollout_engine": 8,
        "samples_per_actor_rank": 64,
        "mini_batches_per_epoch": 1,
        "samples_per_mini_batch_per_rank": 64,
    }
    cfg = load_config(["actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=64"])
    plan = plan_run(cfg, 2)
    numbers = plan.batch_numbers()
    assert numbers["mini_batches_per_epoch"] == 4  # 16 / 4
    assert numbers["samples_per_mini_batch_per_rank"] == 16  # 4 * 8 / 2
    assert plan.roles["actor"].micro_batch_samples == 16  # min(64, 16)


def test_rollout_is_auto_follows_off_policy_steps() -> None:
    def level(*overrides: str) -> str | None:
        return rollout_correction(load_config(list(overrides))).rollout_is

    assert level() is None
    assert level("rollout.mode=async") is None  # continuous batching, still on-policy
    assert level("trainer.max_off_policy_steps=1") == "token"
    assert level("algorithm.rollout_correction.rollout_is=token") == "token"
    assert level("algorithm.rollout_is=token") == "token"  # the key before the section
    assert level("trainer.max_off_policy_steps=1", "algorithm.rollout_is=none") is None
    assert level("trainer.max_off_policy_steps=1", "algorithm.rollout_correction.rollout_is=null") is None


def test_rejection_thresholds_without_rejection_are_noted() -> None:
    plan = plan_run(load_config(["algorithm.rollout_correction.rollout_rs_threshold=1.5"]), 1)
    assert any("rollout_rs_threshold=1.5 ignored" in n for n in plan.notes), plan.notes
    assert not plan.needs_old_log_probs


def test_describe_shows_the_rollout_correction() -> None:
    assert "rollout correction: off" in plan_run(load_config([]), 1).describe("cpu", "gloo")
    cfg = load_config(["algorithm.rollout_correction.rollout_rs=token", "trainer.max_off_policy_steps=0"])
    text = plan_run(cfg, 1).describe("cpu", "gloo")
    assert "rollout correction: token rejection outside [0.5, 2]" in text, text
    assert "old logprobs: yes" in text


def test_rollout_mode_async_is_valid_colocated() -> None:
    """verl users set rollout.mode=async everywhere; it must not be an error with the hybrid engine."""
    text = plan_run(load_config(["rollout.mode=async"]), 2).describe("cpu", "gloo")
    assert "trainer.max_off_policy_steps=0 (on-policy)" in text


def test_describe_eight_ranks_hsdp_tp_look_ahead() -> None:
    cfg = load_config(
        [
            "rollout.tensor_parallel_size=2",
            "actor.fsdp.fsdp_size=2",
            "trainer.max_off_policy_steps=1",
            "placement.actor=[0,1,2,3]",
            "placement.rollout=[4,5,6,7]",
        ]
    )
    text = plan_run(cfg, 8).describe("cpu", "gloo")
    assert "actor mesh ('dp_replicate', 'dp_shard') = (2, 2) (HSDP)" in text
    assert "rollout engines (vllm, tensor_parallel_size=2): [[4, 5], [6, 7]]" in text
    assert "weight sync: broadcast over ranks [0, 4, 5, 6, 7]" in text
    assert "max_off_policy_steps=1" in text and "samples_per_actor_rank: 32" in text
    assert "rollout correction: token-level truncated IS, cap 2" in text


def test_keys_this_run_does_not_use_are_noted() -> None:
    notes = plan_run(load_config(["agent.tools=[calculator]"]), 1).notes
    assert notes == ("agent.tools=['calculator'] ignored: tools are called by agents, and agent.env is unset",)
    notes = plan_run(load_config([*AGENT, "reward.function=torchrl_post.reward.builtin:arithmetic"]), 1).notes
    assert len(notes) == 1 and notes[0].startswith("reward.function=") and "scored by their environment" in notes[0]
    notes = plan_run(load_config(["actor.min_lr_ratio=0.1", "critic.num_cycles=1"]), 1).notes
    assert notes == (
        "actor.min_lr_ratio=0.1 ignored: it shapes actor.lr_scheduler_type=cosine",
        "critic.num_cycles=1.0 ignored: it shapes critic.lr_scheduler_type=cosine",
    )
    assert plan_run(load_config(["actor.lr_scheduler_type=cosine", "actor.min_lr_ratio=0.1"]), 1).notes == ()


# (device, overrides) -> engine dtype, trainer compute dtype, CUDA graphs, sleep level, gpu_memory_utilization
DEVICE_DEFAULTS: list[tuple[str, list[str], tuple[str, str, bool, int, float | None]]] = [
    ("cpu", [], ("float32", "float32", False, 0, None)),
    ("cuda", [], ("bfloat16", "bfloat16", True, 2, None)),  # colocated: memory sized from what is free
    ("cuda", ["placement.actor=[0]", "placement.rollout=[1]"], ("bfloat16", "bfloat16", True, 0, 0.9)),
    ("cuda", ["model.lora_rank=8", "rollout.lora_sync=adapter"], ("bfloat16", "bfloat16", True, 1, None)),
    ("cuda", ["rollout.free_cache_engine=false"], ("bfloat16", "bfloat16", True, 0, None)),
    (
        "cuda",
        ["rollout.dtype=float32", "actor.fsdp.param_dtype=float16", "rollout.enforce_eager=true"]
        + ["rollout.gpu_memory_utilization=0.4"],
        ("float32", "float16", False, 2, 0.4),
    ),
    ("cpu", ["rollout.dtype=bfloat16", "rollout.enforce_eager=false"], ("bfloat16", "float32", True, 0, None)),
]


@pytest.mark.parametrize(("device", "overrides", "expected"), DEVICE_DEFAULTS)
def test_defaults_by_device(device: str, overrides: list[str], expected: tuple[Any, ...]) -> None:
    cfg = load_config(overrides)
    before = copy.deepcopy(cfg)
    plan = plan_run(cfg, 2, device)
    e = plan.engine
    got = (e.dtype, plan.roles["actor"].fsdp.param_dtype, not e.enforce_eager, e.sleep_level, e.gpu_memory_utilization)
    assert got == expected
    assert cfg == before  # `auto` and null resolved in the plan, never in the config
    text = plan.describe(device, "gloo")
    assert f"engine {e.dtype}, trainer compute {expected[1]} over float32 weights" in text
    assert f"cuda graphs {'on' if expected[2] else 'off'}; engine sleep level {expected[3]}" in text


def test_sequence_parallel_in_the_plan() -> None:
    cfg = load_config(["model.ulysses_sequence_parallel_size=2", "algorithm.adv_estimator=gae"])
    plan = plan_run(cfg, 4)
    assert plan.sequence_parallel == 2
    assert {role: r.sequence_parallel for role, r in plan.roles.items()} == {"actor": 2, "critic": 2}
    # the FSDP mesh still shards over all four ranks; each rank still draws its own share of the step
    assert (plan.roles["actor"].mesh_shape, plan.roles["actor"].mini_batch_samples) == ((4,), 32)
    text = plan.describe("cpu", "gloo")
    assert "actor mesh ('dp',) = (4,) (FSDP); Ulysses (dp, sp) = (2, 2): each row's tokens over 2 ranks" in text
    assert plan_run(load_config([]), 4).sequence_parallel == 1


def test_micro_batches_decided_per_trained_role() -> None:
    """Each trained role's update splits a mini-batch into its ppo_micro_batch_size_per_gpu, at most the rows the
    micro-batches split (with sequence parallelism, the sp group's: each rank holds 1/sp of their tokens)."""
    base = ["algorithm.adv_estimator=gae", "actor.use_kl_loss=true", "actor.ppo_mini_batch_size=4"]
    plan = plan_run(load_config([*base, "actor.ppo_micro_batch_size_per_gpu=6"]), 2)  # 16 samples per rank
    assert {role: r.micro_batch_samples for role, r in plan.roles.items()} == {
        "actor": 6,
        "critic": 16,  # critic.ppo_micro_batch_size_per_gpu=32, one mini-batch of 16
        "reference": 0,  # forwards only
    }
    text = plan.describe("cpu", "gloo")
    assert "actor mesh ('dp',) = (2,) (FSDP); micro-batches of 6 samples" in text
    assert "critic mesh ('dp',) = (2,) (FSDP); micro-batches of 16 samples" in text
    sp = plan_run(load_config([*base, "model.ulysses_sequence_parallel_size=2"]), 2)
    assert (sp.roles["actor"].mini_batch_samples, sp.roles["actor"].micro_batch_samples) == (16, 32)


@pytest.mark.parametrize(
    ("overrides", "support", "note"),
    [
        ([], None, None),
        (["rollout.top_p=0.9"], Truncation(0, 0.9), None),
        (["rollout.top_k=20", "rollout.top_p=0.8"], Truncation(20, 0.8), None),
        (["rollout.top_k=20", "rollout.temperature=0"], None, None),  # greedy: vLLM ignores top-k / top-p
        (["rollout.val_kwargs.top_k=5", "rollout.val_kwargs.do_sample=true"], None, None),  # validation's own
        (["rollout.top_p=0.9", "actor.renormalize_logprobs_on_support=false"], None, "each importance ratio carries"),
        (["actor.renormalize_logprobs_on_support=true"], None, "=true ignored: rollout.top_k / top_p keep every"),
        (["actor.renormalize_logprobs_on_support=true", "rollout.temperature=0"], None, "samples greedily"),
    ],
)
def test_sampling_support_is_the_training_samplers_truncation(
    overrides: list[str], support: Truncation | None, note: str | None
) -> None:
    plan = plan_run(load_config(overrides), 1)
    assert plan.sampling_support == support
    assert (note is None) == (not any("renormalize_logprobs_on_support" in n for n in plan.notes)), plan.notes
    assert note is None or any(note in n for n in plan.notes), plan.notes
    text = plan.describe("cpu", "gloo")
    want = (
        "over the full vocabulary"
        if support is None
        else f"renormalised on the sampler's kept set ({support.describe()})"
    )
    assert f"trainer logprobs: {want}" in text, text
