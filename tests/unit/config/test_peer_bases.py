"""Tests of configs/verl.yaml, roll.yaml, trl.yaml and openrlhf.yaml: each peer's defaults in our keys (verl
v0.7.0's ppo_trainer.yaml, ROLL v0.3.0's RLVR pipeline dataclasses, TRL 1.16.0's GRPOConfig, OpenRLHF's
train_ppo_ray.py at 3c3be62). Each composes and
validates, plans on one and two ranks, sets only keys whose peer default differs from the demo's (each line naming
the peer's key), and a handful of its values are asserted with their source."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from torchrl_post import api
from torchrl_post.config.load import default_config_dir, load_config
from torchrl_post.plan import plan_run

BASES = {
    "verl": "verl",
    "roll": "ROLL",
    "trl": "TRL",
    "openrlhf": "OpenRLHF",
}  # --config-name -> the peer its comments name


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every leaf of a YAML mapping."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("name", BASES)
@pytest.mark.parametrize("world", [1, 2])
def test_each_base_composes_validates_and_plans(name: str, world: int) -> None:
    cfg = load_config([], config_name=name)  # load_config validates
    plan = plan_run(cfg, world)
    assert plan.placement.world_size == world
    assert cfg.model.path == "outputs/demo_model" and cfg.data.train_files == "outputs/demo_data/train.jsonl"


@pytest.mark.parametrize("name", BASES)
def test_each_base_sets_only_what_differs_and_names_the_peer(name: str) -> None:
    path = default_config_dir() / f"{name}.yaml"
    text = path.read_text()
    loaded = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(loaded, dict)
    body = {k: v for k, v in loaded.items() if k != "defaults"}
    demo = OmegaConf.structured(load_config([]))
    base = OmegaConf.structured(load_config([], config_name=name))
    for key, value in _leaves(body).items():
        assert OmegaConf.select(base, key) == value, key
        assert OmegaConf.select(demo, key) != value, f"{name}.yaml: {key} is the demo's already"
    for line in text.splitlines():
        if re.match(r"^\s+\w+: \S", line) and "defaults_from:" not in line:  # a value (not a section or comment)
            assert f"# {BASES[name]} " in line, f"{name}.yaml: no {BASES[name]} key named on {line.strip()!r}"


def test_verl_base() -> None:
    cfg = load_config([], config_name="verl")
    assert cfg.algorithm.adv_estimator == "gae"  # algorithm.adv_estimator (ppo_trainer.yaml)
    assert cfg.rollout.n == 1  # actor_rollout_ref.rollout.n (rollout/rollout.yaml)
    assert cfg.actor.lr == 1e-6 and cfg.critic.lr == 1e-5  # actor/actor.yaml, critic/critic.yaml optim.lr
    assert cfg.actor.weight_decay == cfg.critic.weight_decay == 0.01  # optim.weight_decay
    assert cfg.data.train_batch_size == 1024 and cfg.actor.ppo_mini_batch_size == 256  # data/, actor/actor.yaml
    assert cfg.data.max_prompt_length == cfg.data.max_response_length == 512  # data/legacy_data.yaml
    assert cfg.rollout.gpu_memory_utilization == 0.5  # rollout/rollout.yaml
    assert not cfg.actor.use_kl_loss and cfg.algorithm.kl_ctrl.kl_coef == 0.001  # actor/actor.yaml, ppo_trainer.yaml
    assert cfg.algorithm.rollout_correction.rollout_is is None  # algorithm/rollout_correction.yaml
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq) == (-1, -1)  # trainer.save_freq, test_freq
    # trainer.total_epochs 30 and total_training_steps null (ppo_trainer.yaml): epochs mean epochs, no step cap
    assert cfg.trainer.total_epochs == 30 and cfg.trainer.total_training_steps is None
    assert plan_run(cfg, 1).total_steps(train_prompts=2 * 1024) == 2 * 30


def test_roll_base() -> None:
    cfg = load_config([], config_name="roll")
    assert cfg.algorithm.adv_estimator == "gae" and cfg.algorithm.lam == 0.95  # adv_estimator, lambd (PPOConfig)
    assert cfg.rollout.n == 1  # num_return_sequences_in_group (RLVRConfig)
    assert cfg.data.train_batch_size == 128  # rollout_batch_size (BaseConfig)
    assert cfg.actor.lr == cfg.critic.lr == 5e-5  # training_args.learning_rate (TrainingArguments)
    assert cfg.actor.loss_agg_mode == "seq-mean-token-mean"  # loss_agg_mode (PPOConfig)
    assert cfg.actor.clip_ratio_c is None  # dual_clip_loss false (PPOConfig)
    assert (cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k) == (0.95, 0.7, 50)  # GeneratingArguments
    assert cfg.model.dtype == "bfloat16"  # model_args.dtype bf16 (ModelArguments)
    # max_steps 500 (BaseConfig): ROLL counts steps, not epochs
    assert plan_run(cfg, 1).total_steps(train_prompts=100 * 128) == 500


def test_trl_base() -> None:
    cfg = load_config([], config_name="trl")
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.rollout.n == 8  # num_generations (GRPOConfig)
    assert cfg.actor.lr == 1e-6  # learning_rate (GRPOConfig)
    assert not cfg.actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward  # beta 0.0 (GRPOConfig)
    assert cfg.actor.clip_ratio == 0.2 and cfg.actor.clip_ratio_c is None  # epsilon 0.2, delta None (GRPOConfig)
    assert cfg.actor.loss_agg_mode == "token-mean"  # loss_type dapo (GRPOConfig)
    assert cfg.algorithm.norm_adv_by_std_in_grpo  # scale_rewards group (GRPOConfig)
    assert cfg.data.max_response_length == 512  # max_completion_length (GRPOConfig)
    assert cfg.rollout.engine == "hf"  # use_vllm false (GRPOConfig)
    # num_train_epochs 3 with max_steps -1 (TrainingArguments): epochs mean epochs
    assert cfg.trainer.total_epochs == 3 and cfg.trainer.total_training_steps is None
    assert plan_run(cfg, 1).total_steps(train_prompts=5 * 16) == 5 * 3


def test_openrlhf_base() -> None:
    cfg = load_config([], config_name="openrlhf")
    # algo.advantage.estimator gae, whitened over the batch (train_ppo_ray.py, experience_maker.py)
    assert cfg.algorithm.adv_estimator == "gae" and cfg.algorithm.whiten_advantages
    assert cfg.rollout.n == 1 and cfg.data.train_batch_size == 1024  # rollout.n_samples_per_prompt, rollout.batch_size
    assert cfg.actor.lr == 1e-6 and cfg.critic.lr == 9e-6  # actor.adam.lr, critic.adam.lr
    # algo.kl.init_coef 0.01, algo.kl.estimator k1, no algo.kl.use_loss: a reward penalty
    assert cfg.algorithm.use_kl_in_reward and cfg.algorithm.kl_ctrl.kl_coef == 0.01 and not cfg.actor.use_kl_loss
    # actor.lr_scheduler cosine_with_min_lr, actor.lr_warmup_ratio 0.03, actor.min_lr_ratio 0.1
    assert (cfg.actor.lr_scheduler_type, cfg.actor.lr_warmup_steps_ratio, cfg.actor.min_lr_ratio) == (
        "cosine",
        0.03,
        0.1,
    )
    assert cfg.actor.clip_ratio_c is None and cfg.algorithm.rollout_correction.rollout_is is None  # dual_clip None
    assert not cfg.data.apply_chat_template  # data.apply_chat_template false
    # train.batch_size 128 samples of n 1 and train.micro_batch_size 1
    assert cfg.actor.ppo_mini_batch_size == 128 and cfg.actor.ppo_micro_batch_size_per_gpu == 1
    # train.num_episodes 1 (data.max_samples 1e8: no step cap)
    assert cfg.trainer.total_epochs == 1 and cfg.trainer.total_training_steps is None
    assert plan_run(cfg, 1).total_steps(train_prompts=3 * 1024) == 3


def test_a_verl_dry_run_on_two_ranks_plans_a_critic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """PPO needs values: the verl base's GAE puts a critic beside the actor (no model loads: the path is absent)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # plain python, planning for trainer.world_size
    overrides = ["trainer.dry_run=true", "trainer.world_size=2", f"model.path={tmp_path / 'model'}"]
    cfg = load_config([*overrides, f"trainer.default_local_dir={tmp_path / 'run'}"], config_name="verl")
    assert api.run(cfg).dry_run
    out = capsys.readouterr().out
    assert "note: placement.critic: colocated with the actor (algorithm.adv_estimator=gae needs it)" in out
    assert "  critic    ranks [0, 1] (colocated with actor)" in out
    assert "group size: 1;" in out and "prompts_per_step: 1024" in out
