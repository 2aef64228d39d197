"""Tests of torchrl_post/config/load.py: config composition, override syntax and value checks as one-line errors."""

from __future__ import annotations

from typing import Any

import pytest

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import Config
from torchrl_post.plan import plan_run


def _config_error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    msg = str(info.value)
    assert "\n" not in msg, f"ConfigError must be one line: {msg!r}"
    assert msg.strip(), "ConfigError must have a message"
    return msg


# --- load_config --------------------------------------------------------------------------------------------


def test_no_overrides_gives_demo_defaults():
    cfg = load_config([])
    assert isinstance(cfg, Config)
    assert cfg.model.path == "outputs/demo_model"
    assert cfg.data.train_files == "outputs/demo_data/train.jsonl"
    assert cfg.data.val_files == "outputs/demo_data/val.jsonl"
    assert cfg.data.train_batch_size == 16
    assert cfg.data.max_prompt_length == 64
    assert cfg.data.max_response_length == 8
    assert cfg.rollout.engine == "vllm"
    assert cfg.rollout.n == 8
    assert cfg.actor.lr == pytest.approx(5e-4)
    assert cfg.actor.betas == [0.9, 0.999]
    assert cfg.actor.loss_agg_mode == "token-mean"
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.reward.function is None
    assert cfg.placement.actor is None
    assert cfg.placement.rollout == "actor"
    assert cfg.trainer.total_training_steps == 300
    assert cfg.trainer.resume_mode == "auto"
    assert cfg.trainer.logger == ["console"]


def test_overrides_apply():
    cfg = load_config(["actor.lr=0.5", "data.train_files=[a.jsonl,b.jsonl]", "data.val_files=null", "rollout.n=4"])
    assert cfg.actor.lr == 0.5
    assert cfg.data.train_files == ["a.jsonl", "b.jsonl"]
    assert isinstance(cfg.data.train_files, list)
    assert cfg.data.val_files is None
    assert cfg.rollout.n == 4
    # Untouched keys keep their defaults.
    assert cfg.data.train_batch_size == 16


def test_overrides_do_not_leak_between_calls():
    assert load_config(["actor.lr=0.25"]).actor.lr == 0.25
    assert load_config([]).actor.lr == pytest.approx(5e-4)


def test_unknown_key_in_section():
    msg = _config_error(["data.foo=1"])
    assert "data.foo" in msg


def test_unknown_top_level_key():
    msg = _config_error(["foo=1"])
    assert "'foo'" in msg


def test_appended_unknown_key_is_rejected():
    msg = _config_error(["+data.foo=1"])
    assert "data.foo" in msg


def test_wrong_type():
    msg = _config_error(["actor.lr=abc"])
    assert "actor.lr" in msg


def test_bad_enum():
    msg = _config_error(["rollout.engine=x"])
    assert "rollout.engine" in msg


def test_grpo_needs_group_of_two():
    msg = _config_error(["rollout.n=1"])
    assert "rollout.n" in msg
    # n=2 is the smallest valid group.
    assert load_config(["rollout.n=2"]).rollout.n == 2


def test_resume_path_needs_a_path():
    msg = _config_error(["trainer.resume_mode=resume_path"])
    assert "trainer.resume_from_path" in msg
    cfg = load_config(["trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_3"])
    assert cfg.trainer.resume_from_path == "ckpt/global_step_3"


def test_reward_function_needs_colon():
    msg = _config_error(["reward.function=nocolon"])
    assert "reward.function" in msg
    assert load_config(["reward.function=pkg.mod:fn"]).reward.function == "pkg.mod:fn"


@pytest.mark.parametrize("override", ["actor.lr", "+actor.lr=0.5"])
def test_hydra_override_errors_are_one_line(override):
    # Hydra's own multi-line reports (bad override grammar, appending an existing key) are joined into one line.
    msg = _config_error([override])
    assert "actor.lr" in msg


def test_empty_train_files():
    msg = _config_error(["data.train_files="])
    assert "data.train_files" in msg


# --- overrides ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override",
    ["data.train_batch_size=[1,2", "actor.lr=${oops", "trainer.logger=[console", "a b=1", "actor.lr==3"],
)
def test_override_syntax_error_names_the_override(override: str) -> None:
    msg = _config_error(["actor.lr=0.1", override])
    assert f"override {override!r} is not valid override syntax" in msg
    assert "key='...'" in msg


def test_override_without_a_key() -> None:
    assert "override '=3' has no key" in _config_error(["=3"])


def test_override_that_is_a_sweep() -> None:
    msg = _config_error(["data.train_files=a.jsonl,b.jsonl"])
    assert "'data.train_files=a.jsonl,b.jsonl' is a sweep" in msg and "key=[a,b]" in msg


# --- config values ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("actor.lr=nan", "actor.lr=nan is not a finite number"),
        ("actor.lr=inf", "actor.lr=inf is not a finite number"),
        ("reward.timeout_s=nan", "reward.timeout_s=nan"),
        ("actor.grad_clip=-inf", "actor.grad_clip=-inf"),
        ("actor.betas=[0.9,nan]", "actor.betas=[0.9, nan] is not a finite number"),
        ("actor.betas=[0.9,1.5]", "actor.betas=[0.9, 1.5] must be two numbers in [0, 1)"),
        ("model.path=''", "model.path='' must be a non-empty string"),
        ("data.answer_key=''", "data.answer_key='' must be a non-empty string"),
        ("data.prompt_key=' '", "data.prompt_key=' ' must be a non-empty string"),
        ("data.default_data_source=''", "data.default_data_source"),
        ("trainer.default_local_dir=''", "trainer.default_local_dir"),
        ("critic.model.path=''", "critic.model.path"),
        ("actor.weight_decay=-0.1", "actor.weight_decay=-0.1 must be >= 0"),
        ("critic.weight_decay=-1", "critic.weight_decay"),
        ("actor.lr_scheduler_type=linear", "actor.lr_scheduler_type='linear' is not one of constant, cosine"),
        ("critic.lr_scheduler_type=wsd", "critic.lr_scheduler_type"),
        ("actor.min_lr_ratio=1.5", "actor.min_lr_ratio=1.5 must be in [0, 1] (a fraction of actor.lr)"),
        ("critic.min_lr_ratio=-0.1", "critic.min_lr_ratio=-0.1"),
        ("actor.lr_warmup_steps_ratio=2", "actor.lr_warmup_steps_ratio=2.0 must be in [0, 1]"),
        ("critic.lr_warmup_steps_ratio=-0.5", "critic.lr_warmup_steps_ratio"),
        ("actor.num_cycles=0", "actor.num_cycles=0.0 must be > 0"),
        ("actor.clip_ratio_low=-0.1", "actor.clip_ratio_low"),
        ("rollout.max_num_seqs=0", "rollout.max_num_seqs=0 must be > 0"),
        ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization=1.5 must be in (0, 1]"),
        ("rollout.load_format=lazy", "rollout.load_format"),
        ("model.load_format=mmap", "model.load_format"),
        (
            "model.experts_implementation=sonicmoe",
            "model.experts_implementation='sonicmoe' is not one of auto, eager, grouped_mm, batched_mm",
        ),
    ],
)
def test_config_values_checked(override: str, needle: str) -> None:
    assert needle in _config_error([override])


def test_lr_schedule_keys_take_verl_values() -> None:
    cfg = load_config(["actor.lr_scheduler_type=cosine", "actor.lr_warmup_steps=-1", "actor.min_lr_ratio=0.1"])
    assert (cfg.actor.lr_scheduler_type, cfg.actor.lr_warmup_steps, cfg.actor.min_lr_ratio) == ("cosine", -1, 0.1)
    assert load_config(["critic.lr_warmup_steps_ratio=0.03"]).critic.lr_warmup_steps_ratio == 0.03


def test_dependent_config_values_checked() -> None:
    msg = _config_error(["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0"])
    assert "algorithm.kl_ctrl.horizon=0" in msg
    assert "target_kl" in _config_error(["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0"])
    msg = _config_error(["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=0"])
    assert "actor.ppo_max_token_len_per_gpu=0" in msg
    load_config(["algorithm.kl_ctrl.horizon=0"])  # fixed control: the horizon is unused


def test_numbers_where_strings_are_expected_are_strings() -> None:
    cfg = load_config(["model.path=123", "data.prompt_key=5", "trainer.experiment_name=7"])
    assert (cfg.model.path, cfg.data.prompt_key, cfg.trainer.experiment_name) == ("123", "5", "7")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator"),
        ("actor.kl_loss_type=k9", "actor.kl_loss_type"),
        ("algorithm.kl_penalty=big", "algorithm.kl_penalty"),
        ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type"),
        ("actor.clip_ratio_c=0.5", "actor.clip_ratio_c"),
        ("actor.policy_loss=dpo", "actor.policy_loss"),
        ("algorithm.lam=1.5", "algorithm.lam"),
        ("critic.loss_agg_mode=sum", "critic.loss_agg_mode"),
    ],
)
def test_algorithm_keys_validated(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert key in str(err.value) and "\n" not in str(err.value)


AGENT = ["agent.env=torchrl_post.agent.math_agent:MathEnv", "agent.agent=torchrl_post.agent.math_agent:ToolAgent"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.stepwise_advantage.enable=true"], "algorithm.stepwise_advantage.enable=true trains agent steps"),
        ([*AGENT, "algorithm.stepwise_advantage.mode=per_turn"], "algorithm.stepwise_advantage.mode"),
        (
            [*AGENT, "algorithm.stepwise_advantage.enable=true", "algorithm.adv_estimator=gae"],
            "adv_estimator in grpo, rloo",
        ),
        ([*AGENT, "agent.env_workers=-1"], "agent.env_workers"),
    ],
)
def test_agent_and_stepwise_keys_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides)


def test_agent_runs_on_tensor_parallel_and_hf_engines() -> None:
    """The lockstep loop and the hf engine's per-turn batches: no longer refused."""
    cfg = load_config([*AGENT, "rollout.tensor_parallel_size=2", "agent.tools=[calculator]"])
    assert cfg.agent.tools == ["calculator"]
    assert load_config([*AGENT, "rollout.engine=hf"]).rollout.engine == "hf"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.lora_rank=-1"], "model.lora_rank"),
        (["model.lora_rank=8", "model.lora_dropout=1.0"], "model.lora_dropout"),
        (["rollout.limit_images=0"], "rollout.limit_images"),
        (["data.image_key="], "data.image_key"),
        (["model.lora_rank=8", "model.target_modules=[]"], "model.target_modules"),
    ],
)
def test_lora_and_vlm_keys_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides)


# --- model.dtype --------------------------------------------------------------------------------------------


def test_model_dtype_default_and_override() -> None:
    assert load_config([]).model.dtype == "float32"
    assert load_config(["model.dtype=bfloat16"]).model.dtype == "bfloat16"


@pytest.mark.parametrize("value", ["float64", "bf16", "int8"])
def test_invalid_model_dtype_is_one_config_error(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([f"model.dtype={value}"])
    msg = str(info.value)
    assert "\n" not in msg
    assert msg == f"model.dtype='{value}' is not one of float32, bfloat16, float16"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["actor.fsdp.expert_parallel_size=0"], "actor.fsdp.expert_parallel_size=0 must be > 0"),
        (["actor.router_replay=true", "rollout.engine=hf"], "rollout.engine=vllm"),
        (["actor.router_replay=true", "rollout.return_routed_experts=false"], "rollout.return_routed_experts=true"),
        (["actor_rollout_ref.actor.router_replay.mode=R2"], "only R3"),
        (["actor.router_aux_loss_coef=-1"], "actor.router_aux_loss_coef"),
    ],
)
def test_mixture_of_experts_refusals(overrides: list[str], needle: str) -> None:
    assert needle in _config_error(overrides)


def test_expert_parallelism_in_the_plan_and_its_aliases() -> None:
    """ep divides the role's ranks (one line naming the key otherwise), the plan carries it per role (the reference
    takes the actor's; the reward model and teacher, other models, none), and the dry run shows the sparse mesh.
    ROLL's and verl's Megatron keys are renames."""
    plan = plan_run(load_config(["actor.fsdp.expert_parallel_size=2", "actor.use_kl_loss=true"]), 4)
    assert {r: p.expert_parallel for r, p in plan.roles.items()} == {"actor": 2, "reference": 2}
    assert plan.expert_parallel_sizes == {"actor": 2, "reference": 2}
    assert "experts (efsdp, ep) = (2, 2)" in plan.describe("cpu", "gloo")
    own = ["actor.fsdp.expert_parallel_size=2", "actor.use_kl_loss=true", "placement.actor=[0,1]"]
    plan = plan_run(load_config([*own, "placement.reference=[2]"]), 3)  # a reference of its own: no ep there
    assert {r: p.expert_parallel for r, p in plan.roles.items()} == {"actor": 2, "reference": 1}
    with pytest.raises(ConfigError, match=r"actor.fsdp.expert_parallel_size=3 does not divide the actor's 4 ranks"):
        plan_run(load_config(["actor.fsdp.expert_parallel_size=3"]), 4)
    # HSDP: ep lies within a replica's shard group, which holds every expert once
    hsdp = plan_run(load_config(["actor.fsdp.expert_parallel_size=2", "actor.fsdp.fsdp_size=4"]), 8)
    assert "experts (dp_replicate, efsdp, ep) = (2, 2, 2)" in hsdp.describe("cpu", "gloo")
    with pytest.raises(ConfigError, match=r"expert_parallel_size=4 does not divide actor.fsdp.fsdp_size=2 \(HSDP"):
        plan_run(load_config(["actor.fsdp.expert_parallel_size=4", "actor.fsdp.fsdp_size=2"]), 4)
    for key in (
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
        "actor_train.strategy_args.strategy_config.expert_model_parallel_size=2",
    ):
        assert load_config([key]).actor.fsdp.expert_parallel_size == 2, key


def test_router_replay_aliases() -> None:
    assert load_config(["actor_rollout_ref.actor.router_replay.mode=R3"]).actor.router_replay
    assert load_config(["actor_train.router_replay.mode=R3"]).actor.router_replay
    assert not load_config(["actor_train.router_replay.mode=disable"]).actor.router_replay


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["rollout.inflight_update=drop"], "rollout.inflight_update"),
        (["trainer.max_staleness=-1"], "trainer.max_staleness"),
        (["rollout.partial_rollout=true", "data.train_batch_size=8", "rollout.prompts_in_flight=4"],
         "keep at least a batch in flight"),
        (["rollout.partial_rollout=true", "trainer.max_off_policy_steps=2", "trainer.max_staleness=1"],
         "set it to 2 or more"),
        (["rollout.update_on_arrival=true"], "needs rollout.partial_rollout=true"),
    ],
)  # fmt: skip
def test_partial_rollout_refusals(overrides: list[str], needle: str) -> None:
    assert needle in _config_error(overrides)


def test_partial_rollout_composes_with_tensor_parallel_engines_and_rejection_sampling() -> None:
    cfg = load_config(
        ["rollout.partial_rollout=true", "rollout.tensor_parallel_size=2", "algorithm.rejection_sample.enable=true"]
    )
    assert cfg.rollout.partial_rollout and cfg.algorithm.rejection_sample.enable


def test_partial_rollout_streams_agent_episodes() -> None:
    agent = [
        "agent.env=torchrl_post.agent.guess_number:GuessNumberEnv",
        "agent.agent=torchrl_post.agent.guess_number:GuessAgent",
    ]
    cfg = load_config(["rollout.partial_rollout=true", *agent])
    assert cfg.rollout.partial_rollout and cfg.agent.env is not None


def test_partial_rollout_aliases_and_plan() -> None:
    cfg = load_config(["async_training.partial_rollout=true", "trainer.fully_async.max_staleness_steps=3"])
    assert cfg.rollout.partial_rollout and cfg.trainer.max_staleness == 3
    assert load_config(["max_staleness=2"]).trainer.max_staleness == 2  # TRL's name
    plan = plan_run(load_config(["rollout.partial_rollout=true", "data.train_batch_size=4"]), 2)
    assert plan.fill.carry and plan.fill.prompts_in_flight == 2 * 4  # null: two batches
    assert plan.fill.per_engine == 4 and plan.fill.recompute  # colocated: re-prefilled after the update
    assert plan.fill.lag == 0  # colocated: nothing made ahead
    assert plan.rollout_correction.rollout_is == "token"  # rollout_is=auto corrects streamed (off-policy) tokens
    assert "rollouts: partial, 8 prompts in flight" in plan.describe("cpu", "gloo")
    own = ["rollout.partial_rollout=true", "data.train_batch_size=4", "placement.actor=[0,1]", "placement.rollout=[2]"]
    lagged = plan_run(load_config([*own, "trainer.max_off_policy_steps=2"]), 3)
    assert lagged.fill.carry and lagged.fill.prompts_in_flight == 3 * 4 and lagged.fill.lag == 2
    assert not lagged.fill.recompute  # rollout.inflight_update=keep by default
    assert not lagged.fill.on_arrival and "weights taken after the fill" in lagged.describe("cpu", "gloo")
    arrival = plan_run(load_config([*own, "rollout.update_on_arrival=true"]), 3)
    assert arrival.fill.on_arrival
    assert "weights taken when they arrive" in arrival.describe("cpu", "gloo")
    colocated = plan_run(load_config(["rollout.partial_rollout=true", "rollout.update_on_arrival=true"]), 2)
    assert colocated.fill.carry and not colocated.fill.on_arrival
    whole = plan_run(load_config([*own[1:], "trainer.max_off_policy_steps=1"]), 3).fill
    assert (whole.carry, whole.lag) == (False, 1) and "whole batches" in whole.describe()
    assert any("rollout.update_on_arrival=true ignored" in n for n in colocated.notes)
    notes = plan_run(load_config(["trainer.max_staleness=2"]), 2).notes
    assert any("trainer.max_staleness=2 ignored" in n for n in notes)


# --- unknown keys: the whole key and the closest real ones ---------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key", "closest"),
    [
        (
            "actor_rollout_ref.actor.ppo_mini_batch_sizee=4",
            "actor_rollout_ref.actor.ppo_mini_batch_sizee",
            "actor_rollout_ref.actor.ppo_mini_batch_size",
        ),
        ("actor.fsdp.param_ofload=true", "actor.fsdp.param_ofload", "actor.fsdp.param_offload"),
        ("+trainer.total_epoch=2", "trainer.total_epoch", "trainer.total_epochs"),
        ("actr.lr=1", "actr.lr", "actor.lr"),
    ],
)
def test_an_unknown_nested_key_is_named_whole_with_the_closest_real_key(override: str, key: str, closest: str) -> None:
    msg = _config_error([override])
    assert f"unknown config key '{key}'" in msg and f"did you mean {closest}" in msg, msg
    assert msg.startswith(override + ":"), msg


def test_a_misspelt_key_under_an_aliased_subtree_gets_the_closest_one() -> None:
    msg = _config_error(["actor_rollout_ref.rollout.val_kwargs.nn=2"])
    assert "rollout.val_kwargs.nn" in msg and "did you mean actor_rollout_ref.rollout.val_kwargs.n?" in msg, msg


def test_keys_below_a_field_that_takes_any_value_are_left_to_hydra() -> None:
    assert load_config(["placement.actor=[0,1]", "placement.rollout=[2]"]).placement.rollout == [2]


# --- YAML files under --config-path: ours composed by Hydra, a peer's read through the alias table --------------


def _user_config(tmp_path: Any, text: str, extra: str | None = None) -> str:
    (tmp_path / "mine.yaml").write_text(
        "defaults:\n  - config\n" + ("  - extra\n" if extra else "") + "  - _self_\n" + text
    )
    if extra is not None:
        (tmp_path / "extra.yaml").write_text(extra)
    return str(tmp_path)


def _yaml_error(path: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config([], "mine", path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


def test_a_roll_key_in_a_user_yaml_is_read_as_on_the_command_line(tmp_path: Any) -> None:
    notes: list[str] = []
    cfg = load_config(["rollout.n=4"], "mine", _user_config(tmp_path, "rollout_batch_size: 4\n"), notes)
    assert cfg.data.train_batch_size == 4 and cfg.rollout.n == 4  # the command line still wins over the file
    assert cfg.trainer.defaults_from == "torchrl_post"  # its defaults list names ours
    assert any("ROLL's rollout_batch_size=4 is data.train_batch_size=4" in n for n in notes), notes


def test_a_verl_key_in_a_yaml_the_user_file_includes_is_read(tmp_path: Any) -> None:
    path = _user_config(
        tmp_path, "actor:\n  ppo_epochs: 2\n", extra="actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1.0e-6\n"
    )
    cfg = load_config([], "mine", path)
    assert cfg.actor.lr == 1e-6 and cfg.actor.ppo_epochs == 2


def test_a_roll_pipeline_yaml_of_its_own_takes_rolls_defaults_and_interpolations(tmp_path: Any) -> None:
    (tmp_path / "base.yaml").write_text("seed: 7\nppo_epochs: 3\n")
    (tmp_path / "rlvr.yaml").write_text(
        "defaults:\n  - base@_here_\n  - _self_\nhydra:\n  run:\n    dir: .\nexp_name: demo\n"
        "output_dir: ./output/${exp_name}\nrollout_batch_size: 4\nppo_epochs: 2\nresume_from_checkpoint: false\n"
    )
    notes: list[str] = []
    cfg = load_config([], "rlvr", str(tmp_path), notes)
    assert cfg.trainer.defaults_from == "roll", notes
    assert cfg.trainer.seed == 7 and cfg.actor.ppo_epochs == 2  # its own keys after its defaults list's
    assert cfg.trainer.default_local_dir == "./output/demo" and cfg.trainer.resume_mode == "disable"


def test_a_refused_alias_and_a_typo_in_a_user_yaml(tmp_path: Any) -> None:
    msg = _yaml_error(_user_config(tmp_path, "actor_rollout_ref:\n  actor:\n    strategy: megatron\n"))
    assert str(tmp_path / "mine.yaml") in msg and "actor_rollout_ref.actor.strategy" in msg, msg
    msg = _yaml_error(_user_config(tmp_path, "actor:\n  fsdp:\n    param_ofload: true\n"))
    assert "unknown config key 'actor.fsdp.param_ofload'" in msg and "did you mean actor.fsdp.param_offload" in msg


def test_a_user_yaml_with_our_keys_loads(tmp_path: Any) -> None:
    cfg = load_config(
        ["rollout.n=4"], "mine", _user_config(tmp_path, "actor:\n  lr: 0.001\nplacement:\n  actor: [0]\n")
    )
    assert cfg.actor.lr == 0.001 and cfg.placement.actor == [0] and cfg.rollout.n == 4


def test_a_section_given_a_value_says_to_set_its_keys() -> None:
    msg = _config_error(["trainer=5"])
    assert msg.startswith("config key 'trainer' is a section, not a value") and "trainer.<key>=value" in msg, msg


def test_max_staleness_below_the_batches_filled_ahead_is_refused_for_whole_batches_too() -> None:
    rollout_ranks = ["trainer.world_size=2", "placement.actor=[0]", "placement.rollout=[1]"]
    msg = _config_error([*rollout_ranks, "trainer.max_off_policy_steps=3", "trainer.max_staleness=2"])
    assert msg.startswith("trainer.max_staleness=2 is below trainer.max_off_policy_steps=3"), msg
    load_config([*rollout_ranks, "trainer.max_off_policy_steps=3", "trainer.max_staleness=3"])


def test_a_config_name_found_nowhere_is_one_line_naming_the_shipped_ones(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], "nosuch", str(tmp_path))
    msg = str(info.value)
    assert msg.startswith(f"--config-name nosuch: neither {tmp_path} nor the shipped configs have nosuch.yaml")
    assert "verl" in msg and "\n" not in msg
