"""The peers' real launch scripts (tests/peer_scripts/) through our entrypoint's dry run, and the shell reader that
turns them into arguments (tests/unit/config/peer_scripts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.config.peer_scripts import (
    PEER_SCRIPTS,
    Demo,
    Launch,
    World,
    dry_run,
    launches,
    make_demo,
    pairs,
    read_launch,
    read_shell,
    strip_header,
    substitute,
)

NAMES = [p.relative_to(PEER_SCRIPTS).as_posix() for p in launches()]

REFUSED = {
    # verl's tool classes are verl's: tools here are listed in agent.tools (docs/agents.md)
    "verl/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh": "refused: multi_turn.tool_config_path",
    # ROLL's environment managers are ROLL's classes: an environment here is a Python class (agent.env)
    "roll/qwen2.5-0.5B-agentic/agent_val_frozen_lake.yaml": "refused: ROLL's train_env_manager",
    # five domains sampled by ratio, each scored by its own worker (rules, a code sandbox, an LLM judge)
    "roll/qwen3-8B-rlvr_fsdp2/rlvr_config.yaml": "refused: domain_interleave_probs",
    # PPO against a reward model (its 8B RM becomes the tiny one read as a sequence classifier); DAPO with
    # OpenRLHF's reward function file (--reward.remote_url naming a .py: tests/peer_scripts/openrlhf/reward_func.py)
    "openrlhf/train_ppo_ray_hybrid_engine.sh": "accepted",
    "openrlhf/train_dapo_ray_hybrid_engine.sh": "accepted",
}
EXPECTED: dict[str, str] = {name: REFUSED.get(name, "accepted") for name in NAMES}
"""Each script's verdict: "accepted", or "refused: <a part of the error line>" for a documented reason
(docs/coming-from.md's table of scripts)."""


@pytest.fixture(scope="module")
def peer_demo(
    tiny_model: Path,
    tiny_moe_model: Path,
    tiny_vlms: dict[str, Path],
    task_data: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Demo:
    # The demo's rows (task_data writes what the `demo` fixture does, without its two-minute warm start).
    out = tmp_path_factory.mktemp("peer_scripts")
    return make_demo(tiny_model, tiny_vlms["qwen2_5_vl"], tiny_moe_model, *task_data, out)


def test_at_least_sixteen_scripts_each_with_its_source() -> None:
    assert len(NAMES) >= 16, NAMES
    for path in PEER_SCRIPTS.rglob("*"):
        if "__pycache__" in path.parts:  # the bytecode of the .py files (make test compiles it)
            continue
        if path.is_file() and path.suffix != ".py":  # a .py beside a script stands in for a file it names
            first = path.read_text().splitlines()[0]
            assert first.startswith("# source: https://github.com/") and "/blob/" in first, path
            assert strip_header(path.read_text()) != path.read_text(), f"{path}: no '# kept verbatim below' line"


@pytest.mark.parametrize("name", NAMES)
def test_peer_script_dry_run(name: str, peer_demo: Demo) -> None:
    launch = substitute(read_launch(PEER_SCRIPTS / name), peer_demo)
    verdict = dry_run(launch)
    substituted = "\n".join(f"  {k}: {before} -> {after}" for k, before, after in launch.substituted)
    assert verdict.matches(EXPECTED[name]), (
        f"{name}: expected {EXPECTED[name]!r}, got {verdict}\nworld {launch.world}\nsubstituted:\n{substituted}\n"
        f"added: {launch.added}\nargs: {launch.args}"
    )


def test_substitute_replaces_paths_and_sizes_only(peer_demo: Demo) -> None:
    launch = substitute(read_launch(PEER_SCRIPTS / "verl/run_qwen2_5_vl-7b.sh"), peer_demo)
    assert launch.world == World(2, 1)
    changed = {k: after for k, _, after in launch.substituted}
    assert changed == {
        "data.train_files": str(peer_demo.train_files),
        "data.val_files": str(peer_demo.val_files),
        "actor_rollout_ref.model.path": str(peer_demo.vlm),  # a VL model's path gets the tiny VLM
        "trainer.n_gpus_per_node": "2",
        "trainer.nnodes": "1",
    }
    before = read_launch(PEER_SCRIPTS / "verl/run_qwen2_5_vl-7b.sh")
    untouched = [a for a in before.args if a.split("=")[0] not in changed]
    assert all(a in launch.args for a in untouched)
    assert launch.added == []


def test_substitute_world_fits_the_scripts_parallel_degrees(peer_demo: Demo) -> None:
    # DAPO's Qwen2.5-32B: ulysses_sequence_parallel_size=8, rollout TP 4, 16 nodes: one node of 8 here.
    launch = substitute(read_launch(PEER_SCRIPTS / "verl/run_dapo_qwen2.5_32b.sh"), peer_demo)
    assert launch.world == World(8, 1)
    changed = {k: after for k, _, after in launch.substituted}
    assert changed["trainer.nnodes"] == "1" and changed["trainer.n_gpus_per_node"] == "8"
    assert changed["actor_rollout_ref.model.path"] == str(peer_demo.model)
    moe = substitute(read_launch(PEER_SCRIPTS / "verl/test_dapo_qwen3_30b_math.sh"), peer_demo)
    assert {k: a for k, _, a in moe.substituted}["actor_rollout_ref.model.path"] == str(peer_demo.moe)


def test_substitute_flags_and_roll_yaml(peer_demo: Demo) -> None:
    trl = substitute(read_launch(PEER_SCRIPTS / "trl/clis_grpo_num_processes.sh"), peer_demo)
    assert trl.args[trl.args.index("--num_processes") + 1] == "2"
    assert trl.args[trl.args.index("--model_name_or_path") + 1] == str(peer_demo.model)
    assert trl.args[trl.args.index("--dataset_name") + 1] == str(peer_demo.train_files)
    roll = substitute(read_launch(PEER_SCRIPTS / "roll/qwen3-30BA3B-rlvr_fsdp2/rlvr_config.yaml"), peer_demo)
    assert roll.world == World(8, 1)  # ulysses_size 4, and 8 for its batch arithmetic (WORLDS)
    values = dict(pairs(roll))
    assert values["pretrain"] == str(peer_demo.moe)
    assert values["actor_train.device_mapping"] == "'list(range(0,8))'"
    assert values["actor_train.data_args.file_name"] == f"[{peer_demo.train_files}]"
    assert values["actor_train.strategy_args.strategy_config.fsdp_size"] == "8"


def test_rllm_script_gets_the_demo_data_added(peer_demo: Demo) -> None:
    launch = substitute(read_launch(PEER_SCRIPTS / "rllm/train_math_with_tool.sh"), peer_demo)
    assert launch.added == [f"data.train_files={peer_demo.train_files}", f"data.val_files={peer_demo.val_files}"]


# ---- the shell reader ------------------------------------------------------------------------------------------


def test_read_shell_continuations_comments_and_defaults() -> None:
    script = """#!/bin/bash
set -xeuo pipefail
# a comment
NNODES=${NNODES:-16}
MODEL=${MODEL_PATH:-"${HOME}/models/Qwen2.5-32B"}
max_prompt_length=$((1024 * 2))
top_k=-1 # 0 for HF rollout
python3 -m verl.trainer.main_ppo \\
    actor_rollout_ref.model.path="${MODEL}" \\
    data.max_prompt_length=${max_prompt_length} \\
    actor_rollout_ref.rollout.top_k="${top_k}" \\
    trainer.logger='["console","wandb"]' \\
    trainer.nnodes="${NNODES}" $@
"""
    assert read_shell(script) == [
        "actor_rollout_ref.model.path=__HOME__/models/Qwen2.5-32B",
        "data.max_prompt_length=2048",
        "actor_rollout_ref.rollout.top_k=-1",
        'trainer.logger=["console","wandb"]',
        "trainer.nnodes=16",
    ]


def test_read_shell_export_command_substitution_and_ray_job() -> None:
    script = """export VLLM_USE_V1=1
RLLM_DIR=$(python3 -c "import rllm")
ENGINE=${1:-vllm}
train_files="['$HOME/a.parquet', '$HOME/b.parquet']"
ray job submit --no-wait --working-dir "${PWD}" \\
    -- python3 -m recipe.dapo.main_dapo \\
    data.train_files="$train_files" \\
    actor_rollout_ref.rollout.name=$ENGINE \\
    trainer.default_local_dir=$RLLM_DIR/ckpt 2>&1 | tee log.txt
"""
    assert read_shell(script) == [
        "data.train_files=['__HOME__/a.parquet', '__HOME__/b.parquet']",
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.default_local_dir=__RLLM_DIR__/ckpt",
    ]


def test_read_shell_flags_after_accelerate_and_trl() -> None:
    accelerate = """accelerate launch --config_file zero3.yaml examples/scripts/grpo_vlm.py \\
    --model_name_or_path Qwen/Qwen2.5-VL-3B-Instruct --use_peft \\
    --lora_target_modules "q_proj", "v_proj"
"""
    assert read_shell(accelerate) == [
        "--model_name_or_path", "Qwen/Qwen2.5-VL-3B-Instruct", "--use_peft", "--lora_target_modules", "q_proj,",
        "v_proj",
    ]  # fmt: skip
    assert read_shell("trl grpo --num_processes 4") == ["--num_processes", "4"]
    launch = Launch("trl", PEER_SCRIPTS / "trl/x.sh", ["--use_peft", "--range", "0", "1", "--lr=1e-5"])
    assert pairs(launch) == [("use_peft", "true"), ("range", "[0,1]"), ("lr", "1e-5")]


def test_read_shell_without_an_entrypoint_is_an_error() -> None:
    with pytest.raises(ValueError, match="entrypoint"):
        read_shell("set -x\necho hello\n")


def test_verls_quickstart_trains_ppo_with_a_critic_for_its_epochs(peer_demo: Demo) -> None:
    """The silent changes issue 37 found, on the script itself: verl's quickstart PPO became GRPO (this project's
    estimator and n) with its critic.* keys doing nothing, and its 15 epochs stopped at 300 steps."""
    from torchrl_post.config.load import load_command_line

    launch = substitute(read_launch(PEER_SCRIPTS / "verl/quickstart_ppo.sh"), peer_demo)
    verdict = dry_run(launch)
    assert verdict.accepted, verdict
    assert _first_plan_line(verdict.output) == "defaults: verl's ppo_trainer.yaml (configs/verl.yaml)"
    assert "critic: colocated" in verdict.output and "group size: 1;" in verdict.output, verdict.output
    cfg = load_command_line(launch.args)
    assert (cfg.algorithm.adv_estimator, cfg.rollout.n, cfg.critic.lr) == ("gae", 1, 1e-5)
    assert cfg.trainer.total_epochs == 15 and cfg.trainer.total_training_steps is None  # epochs mean epochs
    assert cfg.trainer.logger == ["console"]  # verl's logger given as a name


def _first_plan_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("defaults: "))


def test_roll_and_trl_values_keep_their_meaning(peer_demo: Demo) -> None:
    """ROLL's resume_from_checkpoint false starts fresh (it became the path 'False'); its dual clip's bound is
    1 + 2 x pg_clip (it became 3.0); TRL's LoRA flags carry TRL's defaults."""
    from torchrl_post.config.load import load_command_line

    roll = substitute(read_launch(PEER_SCRIPTS / "roll/qwen3-30BA3B-rlvr_fsdp2/rlvr_config.yaml"), peer_demo)
    cfg = load_command_line(roll.args)
    assert cfg.trainer.defaults_from == "roll" and cfg.trainer.resume_mode == "disable"
    assert cfg.actor.clip_ratio_c == pytest.approx(1 + 2 * cfg.actor.clip_ratio)  # dual_clip_loss: true
    assert cfg.reward.function == "torchrl_post.reward.builtin:math_boxed"  # its one MathRuleRewardWorker domain
    trl = substitute(read_launch(PEER_SCRIPTS / "trl/grpo_vlm_qwen2_5_vl.sh"), peer_demo)
    cfg = load_command_line(trl.args)
    assert cfg.trainer.defaults_from == "trl" and cfg.rollout.engine == "vllm"  # --use_vllm
    assert (cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.target_modules) == (16, 32, ["q_proj", "v_proj"])
