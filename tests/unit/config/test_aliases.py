"""Tests of torchrl_post/config/aliases.py and alias_table.py: the table against the schema, the rewriting of
verl / rLLM / ROLL overrides with one note each, refusals as one line, and verl's GSM8K command as a dry run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_cmd
from torchrl_post.config.alias_table import ALIASES, CONCEPTS, SOURCES
from torchrl_post.config.aliases import OUT, find_alias, our_keys, render, rewrite_overrides
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.plan import plan_run, planned_world

KEYS = our_keys()


def _refused(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        rewrite_overrides(overrides)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip(), msg
    return msg


# --- the table -------------------------------------------------------------------------------------------------


def test_aliases_doc_is_current() -> None:
    assert OUT.read_text() == render(), "docs/aliases.md is out of date: run python -m torchrl_post.config.aliases"


def test_every_alias_maps_to_a_key_of_the_schema() -> None:
    for row in ALIASES:
        assert row.source in SOURCES, row
        if row.kind in ("rename", "same", "combined"):
            assert row.ours in KEYS, f"{row.source}'s {row.key} maps to {row.ours}, which is not in schema.py"
        if row.kind == "same":
            assert row.key == row.ours
        else:
            assert row.key not in KEYS, f"{row.key} is our own key; an alias would shadow it"
    for concept in CONCEPTS:
        assert concept.ours in KEYS, concept


def test_each_of_their_keys_has_one_row() -> None:
    keys = [(row.key, row.subtree) for row in ALIASES]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]


def test_every_refusal_is_one_line_naming_what_to_use() -> None:
    dotted = re.compile(r"[a-z_]+(?:\.[a-z_]+)+")
    for row in ALIASES:
        if row.kind == "refused" or (row.kind == "noop" and row.accepts is not None):
            text = row.refuse
            assert text and "\n" not in text, row
            named = [k for k in dotted.findall(text) if k in KEYS or k.split(".")[0] == "placement"]
            assert named, f"{row.source}'s {row.key}: the refusal names no key to use instead: {text!r}"


# --- rewriting -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected", "note"),
    [
        (
            ["actor_rollout_ref.actor.optim.lr=1e-6"],
            ["actor.lr=1e-6"],
            "verl's actor_rollout_ref.actor.optim.lr=1e-6 is",
        ),
        (["critic.optim.lr=2e-5"], ["critic.lr=2e-5"], "is critic.lr=2e-5 here"),
        (
            ["actor_rollout_ref.actor.optim.warmup_style=cosine", "critic.optim.lr_warmup_steps_ratio=0.1"],
            ["actor.lr_scheduler_type=cosine", "critic.lr_warmup_steps_ratio=0.1"],
            "actor.lr_scheduler_type=cosine",
        ),
        (
            ["actor_rollout_ref.actor.fsdp_config.param_offload=true"],
            ["actor.fsdp.param_offload=true"],
            "actor.fsdp.param_offload",
        ),
        (["+actor_rollout_ref.rollout.tensor_model_parallel_size=2"], ["rollout.tensor_parallel_size=2"], "rollout."),
        (["actor_rollout_ref.rollout.name=vllm"], ["rollout.engine=vllm"], "rollout.engine=vllm"),
        (["actor_rollout_ref.rollout.load_format=dummy_dtensor"], ["rollout.load_format=dummy"], "dummy"),
        (["actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"], ["model.dtype=bfloat16"], "model.dtype=bfloat16"),
        (["actor_rollout_ref.rollout.val_kwargs.n=4"], ["rollout.val_kwargs.n=4"], "rollout.val_kwargs.n=4"),
        (["rllm.stepwise_advantage.mode=per_step"], ["algorithm.stepwise_advantage.mode=per_step"], "rLLM's"),
        (["rllm.compact_filtering.enable=true"], ["algorithm.compact_filtering.enable=true"], "rLLM's"),
        (["rollout_batch_size=64"], ["data.train_batch_size=64"], "ROLL's rollout_batch_size=64"),
        (["num_return_sequences_in_group=8"], ["rollout.n=8"], "rollout.n=8"),
        (
            ["prompt_length=2048", "response_length=4096"],
            ["data.max_prompt_length=2048", "data.max_response_length=4096"],
            "",
        ),
        (
            ["actor_train.model_args.disable_gradient_checkpointing=False"],
            ["model.enable_gradient_checkpointing=true"],
            "(inverted)",
        ),
        (["actor_train.training_args.learning_rate=1.0e-6"], ["actor.lr=1.0e-6"], "actor.lr"),
        (["actor_infer.generating_args.max_new_tokens=512"], ["data.max_response_length=512"], ""),
        (["actor_infer.strategy_args.strategy_name=hf_infer"], ["rollout.engine=hf"], "rollout.engine=hf"),
        (["actor_train.model_args.lora_target='q_proj,v_proj'"], ["model.target_modules=[q_proj,v_proj]"], ""),
        (["track_with=stdout"], ["trainer.logger=[console]"], ""),
        (["dual_clip_loss=false"], ["actor.clip_ratio_c=null"], ""),
        (
            ["resume_from_checkpoint=/ckpt/global_step_5"],
            ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/global_step_5"],
            "trainer.resume_mode=resume_path",
        ),
        # ROLL's false starts fresh (it became the path 'False' once), TRL's true takes the latest checkpoint
        (["resume_from_checkpoint=false"], ["trainer.resume_mode=disable"], "start fresh"),
        (["resume_from_checkpoint=true"], ["trainer.resume_mode=auto"], "the latest checkpoint"),
        # ROLL's dual-clip bound is 1 + 2 x pg_clip (not a constant): 1.4 at its default 0.2, 1.56 at 0.28
        (["dual_clip_loss=true"], ["actor.clip_ratio_c=1.4"], ""),
        (["pg_clip=0.28", "dual_clip_loss=true"], ["actor.clip_ratio=0.28", "actor.clip_ratio_c=1.56"], ""),
        (["max_steps=-1"], ["trainer.total_training_steps=null"], "no cap"),
        (["actor_rollout_ref.hybrid_engine=true"], [], "accepted, it changes nothing here"),
        (["trainer.critic_warmup=0"], [], "accepted"),
        (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40"], [], "actor.ppo_micro_batch_size_per_gpu"),
        (["actor_train.strategy_args.strategy_config.tensor_model_parallel_size=1"], [], "1 is what FSDP2 does"),
        (
            ["custom_reward_function.path=/r/my_reward.py", "custom_reward_function.name=score"],
            ["reward.function='/r/my_reward.py:score'"],
            "are one key here",
        ),
        (["custom_reward_function.path=my_pkg.rewards"], ["reward.function='my_pkg.rewards:compute_score'"], "default"),
        (["trainer.nnodes=2", "trainer.n_gpus_per_node=8"], ["trainer.world_size=16"], "--nproc-per-node 8"),
        (
            ["num_generations=8", "loss_type=dr_grpo", "use_vllm=false"],
            ["rollout.n=8", "actor.loss_agg_mode=seq-mean-token-sum-norm", "rollout.engine=hf"],
            "TRL's num_generations=8 is rollout.n=8 here",
        ),
        (["beta=0.0"], [], "0 is no KL term"),
        (  # this project's keys before algorithm.rollout_correction (and an earlier verl's)
            ["algorithm.rollout_is=token", "algorithm.rollout_is_threshold=3.0"],
            ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=3.0"],
            "verl's algorithm.rollout_is=token is algorithm.rollout_correction.rollout_is=token here",
        ),
        (["algorithm.rollout_is=none"], ["algorithm.rollout_correction.rollout_is=null"], "none are null"),
        (["algorithm.rollout_is=true"], ["algorithm.rollout_correction.rollout_is=token"], "true is token"),
        (["algorithm.rollout_is=auto"], ["algorithm.rollout_correction.rollout_is=auto"], None),
        (
            ["algorithm.rollout_is_veto_threshold=1e-4"],
            ["algorithm.rollout_correction.rollout_token_veto_threshold=1e-4"],
            None,
        ),
        (["algorithm.rollout_correction.rollout_is_batch_normalize=false"], [], "not renormalised"),
        (
            ["algorithm.rollout_correction.rollout_rs=geometric"],
            ["algorithm.rollout_correction.rollout_rs=geometric"],
            None,
        ),
        (["actor.lr=1e-3", "data.train_files=x.parquet"], ["actor.lr=1e-3", "data.train_files=x.parquet"], None),
    ],
)
def test_rewrite(given: list[str], expected: list[str], note: str | None) -> None:
    rewritten, notes = rewrite_overrides(given)
    assert rewritten == expected
    # One note per alias; the keys that combine into one of ours share one.
    rows = [r for r in (find_alias(g.lstrip("+").split("=")[0]) for g in given) if r is not None]
    singles = [r for r in rows if r.kind not in ("combined", "same")]
    assert len(notes) == len(singles) + len({r.ours for r in rows if r.kind == "combined"}), notes
    if note is not None:
        assert any(note in n for n in notes), notes


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        (["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], "actor.fsdp.fsdp_size"),
        (["actor_rollout_ref.actor.megatron.context_parallel_size=2"], "FSDP2 only"),
        (["actor_train.strategy_args.strategy_config.pipeline_model_parallel_size=2"], "actor.fsdp.fsdp_size"),
        (["actor_train.strategy_args.strategy_name=megatron_infer"], "FSDP2 only"),
        (["actor_rollout_ref.rollout.name=sglang"], "rollout.engine=vllm"),
        (["trainer.critic_warmup=5"], "update every step"),
        (["actor_rollout_ref.hybrid_engine=false"], "placement.rollout"),
        (
            ["actor_train.device_mapping='list(range(0,8))'", "actor_infer.device_mapping='list(range(4,12))'"],
            "placement.rollout=actor",
        ),
        (["async_generation_ratio=1"], "trainer.max_off_policy_steps"),
        (["algorithm.rollout_is_mode=mask"], "algorithm.rollout_correction.rollout_rs=token"),
        (["algorithm.rollout_is=geometric"], "algorithm.rollout_correction.rollout_is takes token, sequence"),
        (["algorithm.rollout_correction.rollout_is_batch_normalize=true"], "rollout_is_threshold"),
        (["custom_reward_function.name=score"], "reward.function="),
        (
            ["rllm.stepwise_advantage.no_such_key=1"],
            "algorithm.stepwise_advantage.no_such_key here, which does not exist",
        ),
        (["actor_rollout_ref.actor.optim.lr=1e-6", "actor.lr=1e-5"], "both set actor.lr"),
        (["rollout_batch_size=8", "data.train_batch_size=16"], "both set data.train_batch_size"),
        (["beta=0.04"], "actor.use_kl_loss=true actor.kl_loss_coef=(beta)"),
        (["scale_rewards=batch"], "algorithm.norm_adv_by_std_in_grpo"),
    ],
)
def test_refused_in_one_line(given: list[str], needle: str) -> None:
    msg = _refused(given)
    assert needle in msg, msg


def test_an_alias_agreeing_with_our_key_is_fine_and_unknown_keys_keep_todays_error() -> None:
    assert rewrite_overrides(["rollout.n=5", "actor_rollout_ref.rollout.n=5"])[0] == ["rollout.n=5", "rollout.n=5"]
    with pytest.raises(ConfigError, match="unknown config key 'actor_rollout_ref.no_such.key'"):
        load_config(["actor_rollout_ref.no_such.key=1"])


def test_load_config_applies_aliases_and_returns_their_notes() -> None:
    notes: list[str] = []
    cfg = load_config(
        ["actor_rollout_ref.actor.optim.lr=1e-6", "critic.optim.lr=2e-5", "rollout_batch_size=4"], notes=notes
    )
    assert (cfg.actor.lr, cfg.critic.lr, cfg.data.train_batch_size) == (1e-6, 2e-5, 4)
    # verl's and ROLL's keys together: this project's defaults (GRPO), so the critic key is said to change nothing
    assert cfg.trainer.defaults_from == "torchrl_post"
    assert len(notes) == 4 and notes[3].startswith("critic.lr set a critic that algorithm.adv_estimator=grpo"), notes


# --- trainer.n_gpus_per_node x trainer.nnodes against the launched world -------------------------------------


def test_gpus_per_node_agreeing_with_the_launched_world() -> None:
    notes: list[str] = []
    cfg = load_config(["trainer.n_gpus_per_node=2", "trainer.nnodes=1"], notes=notes)
    assert cfg.trainer.world_size == 2
    assert planned_world(cfg.trainer.world_size, 2, under_torchrun=True) == 2
    assert len(notes) == 2 and "torchrun --nnodes 1 --nproc-per-node 2" in notes[1]
    assert notes[0].startswith("defaults: verl's ppo_trainer.yaml") and cfg.trainer.defaults_from == "verl"


def test_gpus_per_node_disagreeing_with_the_launched_world() -> None:
    cfg = load_config(["trainer.n_gpus_per_node=8", "trainer.nnodes=1"])
    with pytest.raises(ConfigError) as info:
        planned_world(cfg.trainer.world_size, 2, under_torchrun=True)
    msg = str(info.value)
    assert "trainer.n_gpus_per_node x trainer.nnodes" in msg and "torchrun started 2 processes" in msg, msg
    assert "--nproc-per-node" in msg
    assert "both set trainer.world_size" in _refused(["trainer.world_size=4", "trainer.n_gpus_per_node=2"])


# --- the acceptance: verl's examples/grpo_trainer/run_qwen2-7b.sh, a dry run -------------------------------


def verl_gsm8k(train: str, val: str, model: str) -> list[str]:
    """verl's GSM8K GRPO example with their keys and values; the paths ours, and the sizes a 7B run on 8 GPUs
    uses cut to 2 CPU ranks: data.train_batch_size 1024 -> 4, ppo_mini_batch_size 256 -> 2,
    data.max_response_length 1024 -> 64, trainer.n_gpus_per_node 8 -> 2."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "data.max_response_length=64",
        "data.filter_overlong_prompts=True",
        "data.truncation='error'",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console','wandb']",
        "trainer.project_name='verl_grpo_example_gsm8k'",
        "trainer.experiment_name='qwen2_7b_function_rm'",
        "trainer.n_gpus_per_node=2",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ]


def test_verl_gsm8k_command_dry_run_prints_one_note_per_alias(tmp_path: Path) -> None:
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": 'Natalia sold 48 clips. Output the final answer after "####".'}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "48"},
        "extra_info": {"split": "train", "index": 0},
    }
    for name in ("train", "test"):
        pd.DataFrame([row]).to_parquet(tmp_path / f"{name}.parquet")
    args = verl_gsm8k(str(tmp_path / "train.parquet"), str(tmp_path / "test.parquet"), str(tmp_path / "no_model"))
    proc = run_cmd([sys.executable, "-m", "torchrl_post.train", *args, "trainer.dry_run=true"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: verl's ")]
    aliased = [a.split("=")[0] for a in args if a.split("=")[0] not in KEYS]
    assert len(aliased) == 22  # data.truncation is a key of ours
    for key in aliased:
        assert sum(f"{key}=" in n for n in notes) == 1, (key, notes)
    assert len(notes) == len(aliased) - 1  # n_gpus_per_node and nnodes share one note
    assert "rollout engines (vllm, tensor_parallel_size=2): [[0, 1]]" in proc.stdout
    assert "samples_per_step: 20" in proc.stdout


def test_gradient_accumulation_counts_the_optimizer_step_per_rank_as_roll_and_trl_do() -> None:
    """ROLL's per-device micro-batch x gradient accumulation x data-parallel ranks is the step in samples: 1 x 32 x 2
    ranks = 64 samples = 8 prompts of 8; on 4 ranks 16 prompts (the peers' unit depends on the world launched)."""
    roll = [
        "actor_train.training_args.per_device_train_batch_size=1",
        "actor_train.training_args.gradient_accumulation_steps=32",
        "num_return_sequences_in_group=8",
        "rollout_batch_size=64",
    ]
    cfg = load_config(roll)
    assert plan_run(cfg, 2).mini_batch_prompts == 8 and plan_run(cfg, 4).mini_batch_prompts == 16
    # TRL's: 4 per process x 2 accumulated x 2 processes = 16 samples = 4 prompts of 4 generations
    trl = load_config(["per_device_train_batch_size=4", "gradient_accumulation_steps=2", "num_generations=4"])
    assert trl.trainer.defaults_from == "trl" and plan_run(trl, 2).mini_batch_prompts == 4
    with pytest.raises(ConfigError, match=r"= 12 samples per optimizer step, not whole groups of rollout.n=8"):
        plan_run(load_config(["actor.ppo_micro_batch_size_per_gpu=3", "actor.gradient_accumulation_steps=2"]), 2)


@pytest.mark.parametrize(
    ("train", "infer", "expected", "note"),
    [
        ("list(range(0,4))", "list(range(0,4))", ["placement.actor=[0,1,2,3]", "placement.rollout=actor"], ""),
        ("list(range(0,4))", "list(range(0,2))", ["placement.actor=[0,1,2,3]", "placement.rollout=actor"], "2 of"),
        ("list(range(0,2))", "list(range(2,4))", ["placement.actor=[0,1]", "placement.rollout=[2,3]"], ""),
    ],
)
def test_roll_device_mappings_become_placements(train: str, infer: str, expected: list[str], note: str) -> None:
    """ROLL's worker on ranks inside the actor's is colocated with it; on ranks of its own, it gets them."""
    given = [f"actor_train.device_mapping='{train}'", f"actor_infer.device_mapping='{infer}'"]
    rewritten, notes = rewrite_overrides(given)
    assert rewritten == expected and any(note in n for n in notes), notes


def test_roll_difficulty_band_is_rejection_sampling_only_where_it_drops_exactly_uniform_groups() -> None:
    band = ["difficulty_mask=true", "difficulty_low_threshold=0.1", "difficulty_high_threshold=0.95"]
    rewritten = rewrite_overrides([*band, "num_return_sequences_in_group=8"])[0]
    assert rewritten == ["rollout.n=8", "algorithm.rejection_sample.enable=true"]
    # at 16 samples a group with 1 of 16 right (mean 0.0625 < 0.1) is dropped by ROLL, kept here: refused
    assert "not uniform at 16 samples" in _refused([*band, "num_return_sequences_in_group=16"])


def test_roll_rewards_one_math_domain_is_the_builtin_and_several_are_refused() -> None:
    worker = "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker"
    one = [f"rewards.math_rule.worker_cls={worker}", "rewards.math_rule.world_size=8"]
    assert rewrite_overrides(one)[0] == ["reward.function=torchrl_post.reward.builtin:math_boxed"]
    judge = "rewards.llm_judge.worker_cls=roll.pipeline.rlvr.rewards.llm_judge_reward_worker.LLMJudgeRewardWorker"
    assert "llm_judge (LLMJudgeRewardWorker)" in _refused([*one, judge])


def test_trl_peft_flags_are_lora_with_trls_defaults() -> None:
    rewritten, _ = rewrite_overrides(["use_peft=true", "lora_r=8", "lora_target_modules=['q_proj,',v_proj]"])
    assert rewritten == [
        "model.target_modules=[q_proj,v_proj]",
        "model.lora_rank=8",
        "model.lora_alpha=32",
        "model.lora_dropout=0.05",
    ]
    assert rewrite_overrides(["lora_r=8"])[0] == []  # without use_peft TRL trains the whole model


def test_rllm_mask_truncated_samples_masks_the_length_reason_alone() -> None:
    cfg = load_config(["rllm.mask_truncated_samples=true"])
    f = cfg.algorithm.compact_filtering
    assert f.enable and f.mask_max_response_length_exceeded
    assert not (f.mask_timeout or f.mask_error or f.mask_max_turns_exceeded or f.mask_max_prompt_length_exceeded)


# --- OpenRLHF: train_ppo_ray's flags (argparse: `--actor.adam.lr 5e-7` is the override actor.adam.lr=5e-7) --------

_RC = "algorithm.rollout_correction"


@pytest.mark.parametrize(
    ("given", "expected", "note"),
    [
        (
            ["actor.adam.lr=5e-7", "critic.adam.lr=9e-6"],
            ["actor.lr=5e-7", "critic.lr=9e-6"],
            "OpenRLHF's actor.adam.lr",
        ),
        (
            ["rollout.batch_size=128", "rollout.n_samples_per_prompt=8"],
            ["data.train_batch_size=128", "rollout.n=8"],
            "rollout.n=8",
        ),
        (
            ["actor.eps_clip_low_high=[0.2,0.27]"],
            ["actor.clip_ratio_low=0.2", "actor.clip_ratio_high=0.27"],
            "actor.clip_ratio_low=0.2, actor.clip_ratio_high=0.27",
        ),
        (
            ["algo.advantage.estimator=group_norm"],
            [
                "algorithm.adv_estimator=grpo",
                "algorithm.norm_adv_by_std_in_grpo=true",
                "algorithm.whiten_advantages=false",
            ],
            "grpo",
        ),
        (
            ["algo.advantage.estimator=reinforce_baseline"],
            [
                "algorithm.adv_estimator=grpo",
                "algorithm.norm_adv_by_std_in_grpo=false",
                "algorithm.whiten_advantages=true",
            ],
            None,
        ),
        (["ds.param_dtype=bf16"], ["actor.fsdp.param_dtype=bfloat16"], "bfloat16"),
        (["ds.zero_stage=3"], [], "FSDP2"),
        (["vllm.sync_backend=nccl", "train.colocate_all=true"], [], "accepted, it changes nothing here"),
        (
            ["ds.enable_sleep=true", "vllm.enable_sleep=true"],
            ["actor.fsdp.param_offload=true", "actor.fsdp.optimizer_offload=true", "rollout.free_cache_engine=true"],
            None,
        ),
        (["ckpt.save_steps=20", "eval.steps=-1"], ["trainer.save_freq=20", "trainer.test_freq=-1"], None),
        # KL: init_coef is the loss term's coefficient with use_loss, else the reward penalty's
        (
            ["algo.kl.init_coef=1e-3", "algo.kl.use_loss=true", "algo.kl.estimator=k3"],
            [
                "actor.use_kl_loss=true",
                "actor.kl_loss_coef=0.001",
                "actor.kl_loss_type=k3",
                "algorithm.use_kl_in_reward=false",
            ],
            "OpenRLHF's algo.kl.init_coef=0.001 + algo.kl.use_loss=true + algo.kl.estimator=k3 is",
        ),
        (
            ["algo.kl.init_coef=0.01"],
            ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.01", "algorithm.kl_penalty=k1"],
            None,
        ),
        # lengths: prompt + response is two budgets here
        (
            ["data.max_len=2048", "rollout.max_new_tokens=1536"],
            ["data.max_response_length=1536", "data.max_prompt_length=512"],
            "the prompt's budget is what the response leaves",
        ),
        (["data.max_len=2048"], ["data.max_prompt_length=1024", "data.max_response_length=1024"], "half each"),
        # the run's length: the first data.max_samples rows at rollout.batch_size prompts a step, x episodes
        (
            ["rollout.batch_size=128", "data.max_samples=20000"],
            ["data.train_batch_size=128", "trainer.total_epochs=1", "trainer.total_training_steps=156"],
            "trainer.total_training_steps=156",
        ),
        (["train.num_episodes=2"], ["trainer.total_epochs=2", "trainer.total_training_steps=null"], "no step cap"),
        (
            ["algo.advantage.is_correction_enable=true"],
            [f"{_RC}.rollout_is=token", f"{_RC}.rollout_is_threshold=5.0"],
            "raises weights under 0.5",
        ),
        (
            ["algo.advantage.is_correction_enable=true", "algo.advantage.is_correction_type=icepop"],
            [
                f"{_RC}.rollout_is=token",
                f"{_RC}.rollout_is_threshold=5.0",
                f"{_RC}.rollout_rs=token",
                f"{_RC}.rollout_rs_threshold=5.0",
                f"{_RC}.rollout_rs_threshold_lower=0.5",
            ],
            None,
        ),
    ],
)
def test_openrlhf_rewrite(given: list[str], expected: list[str], note: str | None) -> None:
    rewritten, notes = rewrite_overrides(given)
    assert rewritten == expected
    assert notes and all(n.startswith("OpenRLHF's ") for n in notes), notes
    if note is not None:
        assert any(note in n for n in notes), notes


_COLOCATED = [
    "actor.num_nodes=1",
    "actor.num_gpus_per_node=2",
    "ref.num_nodes=1",
    "ref.num_gpus_per_node=2",
    "critic.num_nodes=1",
    "critic.num_gpus_per_node=2",
    "vllm.num_engines=1",
    "vllm.tensor_parallel_size=2",
    "train.colocate_all=true",
]


def test_openrlhf_world_is_the_actors_nodes_times_gpus() -> None:
    rewritten, notes = rewrite_overrides(_COLOCATED)
    assert rewritten == ["rollout.tensor_parallel_size=2", "trainer.world_size=2"]
    world = [n for n in notes if "trainer.world_size=2" in n]
    assert len(world) == 1 and "torchrun --nnodes 1 --nproc-per-node 2" in world[0], notes
    cfg = load_config(_COLOCATED)
    assert cfg.trainer.world_size == 2 and planned_world(cfg.trainer.world_size, 2, under_torchrun=True) == 2
    with pytest.raises(ConfigError, match="trainer.world_size=8"):
        planned_world(load_config(["actor.num_gpus_per_node=8"]).trainer.world_size, 2, under_torchrun=True)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        # without colocate_all the reference (and the engines) are GPUs of their own
        (["train.colocate_all"], "placement.reference=[ranks]"),
        (["train.colocate_all=false"], "placement.reference and placement.critic"),
        (["vllm.num_engines=2"], "must equal actor.num_nodes x actor.num_gpus_per_node = 2"),
        (["ref.num_gpus_per_node=1"], "placement.reference=[ranks]"),
        (["critic.num_nodes=2"], "placement.critic=[ranks]"),
    ],
)
def test_openrlhf_layouts_we_cannot_honour_are_refused(change: list[str], needle: str) -> None:
    """`change`: overrides replacing the colocated layout's; a bare key leaves that key out."""
    keys = {c.split("=")[0] for c in change}
    given = [a for a in _COLOCATED if a.split("=")[0] not in keys] + [c for c in change if "=" in c]
    msg = _refused(given)
    assert needle in msg and "placement." in msg, msg


def test_openrlhf_engines_apart_name_placement_rollout() -> None:
    msg = _refused(["actor.num_gpus_per_node=2", "vllm.num_engines=2"])
    assert "placement.rollout=[ranks]" in msg and "--train.colocate_all" in msg, msg


def test_openrlhf_train_batch_counts_samples_ours_prompts() -> None:
    """OpenRLHF's train.batch_size is samples per optimizer step over all GPUs; actor.ppo_mini_batch_size counts
    prompts: 128 samples of groups of 8 are 16 prompts, and 128 prompts a step x 8 / 128 = 8 optimizer steps, as
    OpenRLHF's replay buffer takes them (rollout.batch_size x n_samples_per_prompt / train.batch_size)."""
    dapo = ["rollout.batch_size=128", "rollout.n_samples_per_prompt=8", "train.batch_size=128"]
    rewritten, notes = rewrite_overrides(dapo)
    assert rewritten == ["data.train_batch_size=128", "rollout.n=8", "actor.ppo_mini_batch_size=16"]
    assert any("128 / rollout.n=8" in n for n in notes), notes
    plan = plan_run(load_config(dapo), 2)
    assert plan.mini_batch_prompts == 16 and plan.prompts_per_step // plan.mini_batch_prompts == 8
    # n=1 (OpenRLHF's PPO example): samples are prompts; our rollout.n given instead of theirs counts too
    assert rewrite_overrides(["rollout.n_samples_per_prompt=1", "train.batch_size=128"])[0][-1].endswith("=128")
    assert rewrite_overrides(["rollout.n=4", "train.batch_size=128"])[0][-1] == "actor.ppo_mini_batch_size=32"
    # no n at all: ours (8), said in the note
    rewritten, notes = rewrite_overrides(["train.batch_size=64"])
    assert rewritten == ["actor.ppo_mini_batch_size=8"] and "OpenRLHF's default is 1" in notes[0]
    assert "not whole groups of rollout.n=8" in _refused(["rollout.n_samples_per_prompt=8", "train.batch_size=100"])


def test_openrlhf_reward_model_is_ours_and_a_reward_server_refused_in_one_line() -> None:
    rewritten, _ = rewrite_overrides(["reward.model_name_or_path=/models/rm", "reward.micro_batch_size=4"])
    assert set(rewritten) == {
        "reward_model.enable=true",
        "reward_model.model.path=/models/rm",
        "reward_model.micro_batch_size_per_gpu=4",
    }
    assert rewrite_overrides(["reward.remote_url=/x/reward_func.py"])[0] == [
        "reward.function='/x/reward_func.py:reward_func'"
    ]
    servers = rewrite_overrides(["reward.remote_url=http://rm:5000/get_reward,http://rm2:5000/get_reward"])[0]
    cfg = load_config(servers)
    assert cfg.reward.server.url == ["http://rm:5000/get_reward", "http://rm2:5000/get_reward"]
    assert cfg.reward.function is None
    msg = _refused(["reward.remote_url=rm:5000"])
    assert msg.startswith("OpenRLHF's reward.remote_url=rm:5000 has no equivalent here: it takes a reward function")


def test_openrlhf_flags_pick_openrlhfs_defaults() -> None:
    from torchrl_post.config.aliases import written_in
    from torchrl_post.config.command_line import parse_command_line
    from torchrl_post.config.load import load_command_line

    line = parse_command_line(
        ["--actor.adam.lr", "5e-7", "--actor.eps_clip_low_high", "0.2", "0.27", "--ds.packing_samples"]
    )
    assert line.overrides == ["actor.adam.lr=5e-7", "actor.eps_clip_low_high=[0.2,0.27]", "ds.packing_samples=true"]
    assert written_in(line.overrides, flags=True) == (
        "openrlhf",
        ["actor.adam.lr", "actor.eps_clip_low_high", "ds.packing_samples"],
    )
    assert written_in(["num_generations=4"], flags=True)[0] == "trl"  # TRL's flags still pick TRL's defaults
    assert written_in(["rollout.temperature=0.6"], flags=True)[0] is None  # a key of ours alone says nothing
    notes: list[str] = []
    cfg = load_command_line(["--actor.adam.lr", "5e-7", "--actor.eps_clip_low_high", "0.2", "0.27"], notes)
    assert cfg.trainer.defaults_from == "openrlhf"
    assert notes[0].startswith("defaults: OpenRLHF's train_ppo_ray (configs/openrlhf.yaml)"), notes
    assert (cfg.actor.lr, cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) == (5e-7, 0.2, 0.27)
    assert cfg.algorithm.adv_estimator == "gae" and cfg.rollout.n == 1  # OpenRLHF's, not ours (grpo, 8)
    # train.batch_size alone (samples) is divided by the base's n (OpenRLHF's 1), not ours
    cfg = load_command_line(["--train.batch_size", "64"], notes)
    assert cfg.actor.ppo_mini_batch_size == 64 and cfg.rollout.n == 1
    # an estimator OpenRLHF does not whiten is not whitened here either (the base whitens gae's)
    cfg = load_command_line(["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4"], [])
    assert cfg.algorithm.adv_estimator == "grpo" and not cfg.algorithm.whiten_advantages


def test_openrlhf_keys_that_are_ours_too_keep_our_meaning() -> None:
    """OpenRLHF's rollout.temperature, rollout.top_p, data.apply_chat_template, data.image_key and
    {actor,critic}.min_lr_ratio are keys of ours with the same meaning: they pass through; no OpenRLHF row may
    shadow a key of ours."""
    for key in (
        "rollout.temperature",
        "rollout.top_p",
        "data.apply_chat_template",
        "data.image_key",
        "actor.min_lr_ratio",
    ):
        assert key in KEYS
    assert rewrite_overrides(["rollout.temperature=0.6", "data.apply_chat_template=true"]) == (
        ["rollout.temperature=0.6", "data.apply_chat_template=true"],
        [],
    )
    assert not [r.key for r in ALIASES if r.source == "OpenRLHF" and r.key in KEYS]


def test_verls_newer_lora_section_with_megatrons_module_names() -> None:
    rewritten, _ = rewrite_overrides(
        [
            "actor_rollout_ref.model.lora.rank=32",
            "actor_rollout_ref.model.lora.alpha=64",
            "actor_rollout_ref.model.lora.target_modules=[linear_qkv,linear_proj,linear_fc1,linear_fc2]",
            "actor_rollout_ref.model.lora.merge=false",
        ]
    )
    assert rewritten == [
        "model.lora_rank=32",
        "model.lora_alpha=64",
        "model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        "rollout.lora_sync=adapter",
    ]
    assert "DoRA" in _refused(["actor_rollout_ref.model.lora.type=dora"])


def test_rllm_agent_trainer_keys() -> None:
    rewritten, notes = rewrite_overrides(
        [
            "rllm.rejection_sample.multiplier=3",
            "rllm.agent.trajectory_timeout=null",
            "rllm.workflow.use_workflow=False",
            "rllm.workflow.n_parallel_tasks=256",
            "rllm.agent.trajectory_timeout=120",
        ][:4]
    )
    assert rewritten == ["algorithm.rejection_sample.max_extra_rounds=2"]  # 3 x the batch: 2 more rounds at most
    assert "rllm.agent.trajectory_timeout=null accepted, it changes nothing here" in notes[1], notes
    assert rewrite_overrides(["rllm.agent.trajectory_timeout=120"])[0] == ["agent.timeout_s=120.0"]
    assert "agent.env" in _refused(["rllm.workflow.use_workflow=true"])
    assert "a later issue" in _refused(["rllm.distill.enable=true"])


def test_trl_reward_funcs_with_a_model_and_reward_weights_are_the_rule_the_reward_model_and_their_weights() -> None:
    rewritten, notes = rewrite_overrides(["reward_funcs=[accuracy_reward,org/rm-7b]", "reward_weights=[1.0,0.5]"])
    assert set(rewritten) == {
        "reward.function='torchrl_post.reward.builtin:accuracy_reward'",
        "reward_model.enable=true",
        "reward_model.model.path=org/rm-7b",
        "reward.weights.rule=1.0",
        "reward.weights.reward_model=0.5",
    }
    # without weights, TRL's default weighs each 1; a model alone replaces the rule
    assert "reward.weights.reward_model=1.0" in rewrite_overrides(["reward_funcs=[accuracy_reward,org/rm]"])[0]
    assert rewrite_overrides(["reward_funcs=org/rm"])[0] == [
        "reward_model.enable=true",
        "reward_model.model.path=org/rm",
    ]
    for bad, part in (
        (["reward_funcs=[a.b.c,org/rm]", "reward_weights=[1.0]"], "gives 1 weights for the 2 reward_funcs"),
        (["reward_funcs=[org/a,org/b]"], "names 2 reward models"),
        (["reward_weights=[1.0]"], "weighs --reward_funcs, which the command line does not give"),
    ):
        with pytest.raises(ConfigError) as info:
            rewrite_overrides(bad)
        assert part in str(info.value) and "\n" not in str(info.value)
