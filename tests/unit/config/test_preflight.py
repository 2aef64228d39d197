"""Preflight checks (config/preflight.py): broken model directories, tokenizers, length budgets, the critic's
model, run and resume directories, each one line naming the key, found before any model loads."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, AutoTokenizer, Qwen2VLConfig

from tests.conftest import torchrun
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.preflight import (
    check_critic,
    check_experts,
    check_judge,
    check_length_budget,
    check_model_dir,
    check_moe_lora,
    check_resume_path,
    check_reward_model,
    check_run_dir,
    check_sequence_parallel,
    check_tokenizer,
    preflight,
)


def _error(fn: Any, *args: Any) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip(), f"must be one line: {msg!r}"
    return msg


@pytest.fixture
def model_copy(tiny_model: Path, tmp_path: Path) -> Path:
    """A copy of the session's tiny model, to break one file of."""
    out = tmp_path / "model"
    shutil.copytree(tiny_model, out)
    return out


# --- check_model_dir ----------------------------------------------------------------------------------------


def test_good_model_dir_returns_its_config(model_copy: Path) -> None:
    config = check_model_dir(str(model_copy), "model.path")
    assert config.model_type == "qwen2" and config.vocab_size == 128


def test_missing_model_dir(tmp_path: Path) -> None:
    msg = _error(check_model_dir, str(tmp_path / "nope"), "model.path")
    assert "model.path=" in msg and "does not exist" in msg and "make demo" in msg


def test_model_path_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    msg = _error(check_model_dir, str(tmp_path / "weights.bin"), "model.path")
    assert "is a file, not a model directory" in msg


def test_no_config_json_keeps_the_old_message(model_copy: Path) -> None:
    (model_copy / "config.json").unlink()
    assert "is not a model directory (no config.json)" in _error(check_model_dir, str(model_copy), "model.path")


def test_config_json_not_json(model_copy: Path) -> None:
    text = (model_copy / "config.json").read_text()
    (model_copy / "config.json").write_text(text[: len(text) // 2])  # cut mid-way, as an interrupted copy would
    msg = _error(check_model_dir, str(model_copy), "model.path")
    assert "config.json is not valid JSON" in msg and "line " in msg


def test_config_json_transformers_cannot_read(model_copy: Path) -> None:
    raw = json.loads((model_copy / "config.json").read_text())
    raw["model_type"] = "no_such_architecture"
    (model_copy / "config.json").write_text(json.dumps(raw))
    msg = _error(check_model_dir, str(model_copy), "model.path")
    assert "transformers cannot load its config.json" in msg and "no_such_architecture" in msg


def test_no_safetensors_keeps_the_old_message(model_copy: Path) -> None:
    (model_copy / "model.safetensors").unlink()
    assert "has no *.safetensors weights" in _error(check_model_dir, str(model_copy), "model.path")


def test_truncated_safetensors(model_copy: Path) -> None:
    f = model_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    msg = _error(check_model_dir, str(model_copy), "model.path")
    assert "model.safetensors is truncated" in msg and str(len(data) - 1000) in msg and str(len(data)) in msg


def test_safetensors_cut_inside_its_header(model_copy: Path) -> None:
    f = model_copy / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    assert "truncated" in _error(check_model_dir, str(model_copy), "model.path")
    f.write_bytes(b"\x01\x02")
    assert "truncated" in _error(check_model_dir, str(model_copy), "model.path")


def test_safetensors_with_a_corrupt_header(model_copy: Path) -> None:
    f = model_copy / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8] = ord("#")  # the header's opening brace
    f.write_bytes(bytes(data))
    assert "corrupt header" in _error(check_model_dir, str(model_copy), "model.path")


def test_safetensors_with_trailing_bytes(model_copy: Path) -> None:
    with (model_copy / "model.safetensors").open("ab") as f:
        f.write(b"\0" * 10)
    assert "10 bytes past the data" in _error(check_model_dir, str(model_copy), "model.path")


def test_safetensors_header_offsets_checked(model_copy: Path) -> None:
    f = model_copy / "model.safetensors"
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"] = "nowhere"
    new = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(new)) + new + data[8 + n :])
    msg = _error(check_model_dir, str(model_copy), "model.path")
    assert "corrupt header" in msg and name in msg


def test_index_naming_missing_shards(model_copy: Path) -> None:
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model.safetensors"}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = _error(check_model_dir, str(model_copy), "model.path")
    assert "model.safetensors.index.json" in msg and "model-00001-of-00002.safetensors" in msg
    (model_copy / "model.safetensors.index.json").write_text("{broken")
    assert "not a valid index" in _error(check_model_dir, str(model_copy), "model.path")


def test_index_naming_existing_shards_is_fine(model_copy: Path) -> None:
    index = {"metadata": {}, "weight_map": {"a": "model.safetensors"}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    check_model_dir(str(model_copy), "model.path")


def test_key_is_named(model_copy: Path) -> None:
    (model_copy / "config.json").write_text("{")
    assert _error(check_model_dir, str(model_copy), "critic.model.path").startswith("critic.model.path=")


# --- check_tokenizer ----------------------------------------------------------------------------------------


def _tokenizer_and_config(path: Path) -> tuple[Any, Any]:
    return AutoTokenizer.from_pretrained(path), AutoConfig.from_pretrained(path)


def test_good_tokenizer(model_copy: Path) -> None:
    check_tokenizer(*_tokenizer_and_config(model_copy), str(model_copy))


def test_no_tokenizer_files(model_copy: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_copy / name).unlink()
    tok, config = _tokenizer_and_config(model_copy)
    assert len(tok) == 1  # what transformers silently builds: every prompt encodes to nothing
    msg = _error(check_tokenizer, tok, config, str(model_copy))
    assert "has no tokenizer files" in msg and "tokenizer.json" in msg


def test_tokenizer_that_encodes_to_nothing(model_copy: Path) -> None:
    (model_copy / "tokenizer.json").unlink()  # tokenizer_config.json alone: still a one-token tokenizer
    tok, config = _tokenizer_and_config(model_copy)
    msg = _error(check_tokenizer, tok, config, str(model_copy))
    assert "encodes 'hello world 123' to []" in msg


def test_tokenizer_larger_than_the_vocabulary(model_copy: Path) -> None:
    raw = json.loads((model_copy / "config.json").read_text())
    raw["vocab_size"] = 64
    (model_copy / "config.json").write_text(json.dumps(raw))
    msg = _error(check_tokenizer, *_tokenizer_and_config(model_copy), str(model_copy))
    assert "101 tokens" in msg and "vocab_size is 64" in msg


def test_tokenizer_without_eos(model_copy: Path) -> None:
    tok, config = _tokenizer_and_config(model_copy)
    tok.eos_token = None
    assert "no eos_token" in _error(check_tokenizer, tok, config, str(model_copy))


def test_vlm_vocab_size_is_read_from_text_config(model_copy: Path) -> None:
    tok, _ = _tokenizer_and_config(model_copy)
    check_tokenizer(tok, Qwen2VLConfig(text_config={"vocab_size": 128}), str(model_copy))
    msg = _error(check_tokenizer, tok, Qwen2VLConfig(text_config={"vocab_size": 100}), str(model_copy))
    assert "vocab_size is 100" in msg


# --- check_length_budget ------------------------------------------------------------------------------------


def test_length_budget(model_copy: Path) -> None:
    config = AutoConfig.from_pretrained(model_copy)  # max_position_embeddings=256
    check_length_budget(load_config(["data.max_prompt_length=200", "data.max_response_length=56"]), config)
    cfg = load_config(["data.max_prompt_length=200", "data.max_response_length=57"])
    msg = _error(check_length_budget, cfg, config)
    assert "data.max_prompt_length=200 + data.max_response_length=57 = 257" in msg and "256 positions" in msg


def test_length_budget_of_a_vision_language_model() -> None:
    config = Qwen2VLConfig(text_config={"max_position_embeddings": 64})
    msg = _error(check_length_budget, load_config(["data.max_prompt_length=64"]), config)
    assert "64 positions" in msg
    check_length_budget(load_config(["data.max_prompt_length=56"]), config)


def test_length_budget_counts_rope_scaling(model_copy: Path) -> None:
    config = AutoConfig.from_pretrained(model_copy)
    config.rope_scaling = {"rope_type": "linear", "factor": 4.0}
    check_length_budget(load_config(["data.max_prompt_length=1000", "data.max_response_length=24"]), config)


def test_sequence_parallel_against_the_model(model_copy: Path) -> None:
    config = AutoConfig.from_pretrained(model_copy)  # 2 attention heads
    check_sequence_parallel(load_config(["model.ulysses_sequence_parallel_size=2"]), config)
    msg = _error(check_sequence_parallel, load_config(["model.ulysses_sequence_parallel_size=4"]), config)
    assert msg.startswith("model.ulysses_sequence_parallel_size=4 does not divide the 2 attention heads of model.path=")
    vlm = Qwen2VLConfig(text_config={"num_attention_heads": 4})
    msg = _error(check_sequence_parallel, load_config(["model.ulysses_sequence_parallel_size=2"]), vlm)
    assert "is a vision-language model" in msg and msg.endswith("set it to 1")
    config._attn_implementation = "flash_attention_2"
    msg = _error(check_sequence_parallel, load_config(["model.ulysses_sequence_parallel_size=2"]), config)
    assert msg.endswith(
        "runs sdpa or eager attention; model.path=" + repr(load_config([]).model.path) + " asks for flash_attention_2"
    )


def test_router_replay_needs_a_mixture_of_experts(model_copy: Path) -> None:
    from transformers import Qwen3MoeConfig

    on = load_config(["actor.router_replay=true"])
    dense = AutoConfig.from_pretrained(model_copy)
    assert "has no mixture-of-experts layers" in _error(check_experts, on, dense)
    check_experts(on, Qwen3MoeConfig(num_experts=4))
    check_experts(load_config([]), dense)  # replay off: any model
    ep = load_config(["actor.fsdp.expert_parallel_size=2"])
    assert "actor.fsdp.expert_parallel_size=2: model.path=" in _error(check_experts, ep, dense)
    odd = load_config(["actor.fsdp.expert_parallel_size=3"])
    assert "does not divide the 4 experts" in _error(check_experts, odd, Qwen3MoeConfig(num_experts=4))
    check_experts(ep, Qwen3MoeConfig(num_experts=4))


def test_lora_on_a_mixture_of_experts_model(tiny_moe_model: Path, model_copy: Path, tmp_path: Path) -> None:
    """The experts' adapter reaches the engine merged only, and has no dropout: refused before any model loads."""
    lora = [f"model.path={tiny_moe_model}", f"trainer.default_local_dir={tmp_path / 'run'}", "model.lora_rank=8"]
    assert preflight(load_config(lora)).model_type == "qwen3_moe"  # rollout.lora_sync=merged, the default
    assert _error(preflight, load_config([*lora, "rollout.lora_sync=adapter"])) == (
        f"rollout.lora_sync=adapter: model.path={str(tiny_moe_model)!r} is a mixture-of-experts model (4 experts), "
        "whose fused-expert adapters the adapter sync cannot load into vLLM; use rollout.lora_sync=merged"
    )
    msg = _error(preflight, load_config([*lora, "model.lora_dropout=0.1"]))
    assert msg.startswith("model.lora_dropout=0.1: model.path=") and msg.endswith("set model.lora_dropout=0")
    dense = load_config([f"model.path={model_copy}", "model.lora_rank=8", "rollout.lora_sync=adapter"])
    check_moe_lora(dense, AutoConfig.from_pretrained(model_copy))  # a dense model serves its adapter


# --- check_critic -------------------------------------------------------------------------------------------


def test_critic_path_missing(tmp_path: Path) -> None:
    cfg = load_config(["algorithm.adv_estimator=gae", f"critic.model.path={tmp_path / 'nope'}"])
    msg = _error(check_critic, cfg)
    assert msg.startswith("critic.model.path=") and "does not exist" in msg


def test_critic_path_unused_or_default(tmp_path: Path, model_copy: Path) -> None:
    # grpo builds no critic (the plan says so): its path is not looked at; gae without a path takes model.path.
    assert check_critic(load_config([f"critic.model.path={tmp_path / 'nope'}"]), used=False) is None
    assert check_critic(load_config(["algorithm.adv_estimator=gae"])) is None
    cfg = load_config(["algorithm.adv_estimator=gae", f"critic.model.path={model_copy}"])
    assert check_critic(cfg).model_type == "qwen2"


def test_critic_vocabulary_must_cover_the_tokenizer(model_copy: Path, tiny_model: Path) -> None:
    raw = json.loads((model_copy / "config.json").read_text())
    raw["vocab_size"] = 64
    (model_copy / "config.json").write_text(json.dumps(raw))
    cfg = load_config(["algorithm.adv_estimator=gae", f"critic.model.path={model_copy}"])
    msg = _error(check_critic, cfg, AutoTokenizer.from_pretrained(tiny_model))
    assert "vocab_size=64" in msg and "101 tokens" in msg


# --- check_reward_model -------------------------------------------------------------------------------------


def _as_classifier(model_copy: Path, **changes: Any) -> Path:
    raw = json.loads((model_copy / "config.json").read_text())
    raw |= {"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 1, **changes}
    (model_copy / "config.json").write_text(json.dumps(raw))
    return model_copy


def test_reward_model_is_a_one_label_sequence_classifier(model_copy: Path) -> None:
    enabled = ["reward_model.enable=true"]
    assert "reward_model.model.path is not set" in _error(check_reward_model, load_config(enabled))
    cfg = load_config([*enabled, f"reward_model.model.path={model_copy}"])
    msg = _error(check_reward_model, cfg)  # the tiny causal LM given as a reward model
    assert msg.startswith(f"reward_model.model.path={str(model_copy)!r} is a Qwen2ForCausalLM, not a sequence")
    raw = json.loads((model_copy / "config.json").read_text())
    _as_classifier(model_copy, num_labels=2, id2label={"0": "bad", "1": "good"})
    assert "num_labels=2" in _error(check_reward_model, cfg)
    (model_copy / "config.json").write_text(json.dumps(raw))
    _as_classifier(model_copy)
    assert check_reward_model(cfg).eos_token_id is not None  # its own tokenizer
    assert check_reward_model(load_config([f"reward_model.model.path={tmp_path_missing(model_copy)}"]), False) is None


def tmp_path_missing(model_copy: Path) -> Path:
    return model_copy.parent / "nope"


# --- check_run_dir and check_resume_path --------------------------------------------------------------------


def test_run_dir_fine_when_new_or_existing(tmp_path: Path) -> None:
    check_run_dir(str(tmp_path / "a" / "b" / "run"))
    check_run_dir(str(tmp_path))
    assert not (tmp_path / "a").exists()  # a check creates nothing


def test_run_dir_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("")
    assert "is a file, not a directory" in _error(check_run_dir, str(tmp_path / "run"))
    msg = _error(check_run_dir, str(tmp_path / "run" / "sub"))
    assert "cannot be created" in msg and "is a file" in msg


def test_run_dir_is_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "run").symlink_to(tmp_path / "gone")
    assert "broken symbolic link" in _error(check_run_dir, str(tmp_path / "run"))


def test_run_dir_read_only_parent(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("running as root (or with CAP_DAC_OVERRIDE): chmod does not stop writes here")
        msg = _error(check_run_dir, str(parent / "run"))
        assert "trainer.default_local_dir=" in msg and "not writable" in msg
        msg = _error(check_run_dir, str(parent))
        assert "not writable" in msg
    finally:
        parent.chmod(0o700)


def test_resume_path(tmp_path: Path) -> None:
    def cfg(path: Path) -> Any:
        return load_config(["trainer.resume_mode=resume_path", f"trainer.resume_from_path={path}"])

    assert "does not exist" in _error(check_resume_path, cfg(tmp_path / "nope"))
    (tmp_path / "file").write_text("")
    assert "is a file" in _error(check_resume_path, cfg(tmp_path / "file"))
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (2, 10):
        (ckpts / f"global_step_{step}").mkdir(parents=True)
        (ckpts / f"global_step_{step}" / "trainer_state.json").write_text("{}")
    (ckpts / "global_step_12.tmp").mkdir()  # an unfinished save is no candidate
    msg = _error(check_resume_path, cfg(tmp_path / "run"))
    assert "not a complete checkpoint" in msg and "global_step_10" in msg
    # a half-written save named directly (a crash mid-save leaves global_step_N.tmp without trainer_state.json)
    msg = _error(check_resume_path, cfg(ckpts / "global_step_12.tmp"))
    assert "global_step_12.tmp' is not a complete checkpoint" in msg and "global_step_10" not in msg
    check_resume_path(cfg(ckpts / "global_step_2"))
    check_resume_path(load_config([f"trainer.resume_from_path={tmp_path / 'nope'}"]))  # resume_mode=auto: unused


def test_preflight_runs_the_model_free_checks(model_copy: Path, tmp_path: Path) -> None:
    base = [f"model.path={model_copy}", f"trainer.default_local_dir={tmp_path / 'run'}"]
    assert preflight(load_config(base)).model_type == "qwen2"
    assert "256 positions" in _error(preflight, load_config([*base, "data.max_prompt_length=250"]))


# --- through the entrypoint ---------------------------------------------------------------------------------


@pytest.mark.e2e
def test_truncated_weights_fail_before_any_model_loads(
    model_copy: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    f = model_copy / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    proc = torchrun(
        1,
        [
            "-m",
            "torchrl_post.train",
            f"model.path={model_copy}",
            f"data.train_files={task_data[0]}",
            f"data.val_files={task_data[1]}",
            "data.train_batch_size=4",
            "rollout.n=2",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "model.safetensors is truncated" in errors[0], out[-3000:]
    # Everything the rank printed before its error line (torchrun's own report of the exit follows it).
    before = proc.stdout + proc.stderr[: proc.stderr.index("error: ")]
    for loading in ("Traceback", "Loading weights", "vllm", "vLLM", "Loading checkpoint"):
        assert loading not in before, f"{loading!r} before the error:\n{before[-3000:]}"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# --- the dry run refuses what the run refuses ---------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _dry_run_error(cfg: Any) -> str:
    from torchrl_post import api

    cfg.trainer.dry_run = True
    with pytest.raises(ConfigError) as info:
        api.run(cfg)
    return str(info.value)


@pytest.mark.parametrize(
    "case",
    ["sequence parallel size not dividing the heads", "model directory without config.json"],
)
def test_the_dry_run_and_the_run_refuse_with_the_same_line(case: str, model_copy: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("from an earlier run\n")
    overrides = [f"model.path={model_copy}", f"trainer.default_local_dir={run_dir}"]
    if case.startswith("sequence"):  # the tiny model has 2 attention heads
        overrides += ["model.ulysses_sequence_parallel_size=4", "trainer.world_size=4"]
        needle = "model.ulysses_sequence_parallel_size=4 does not divide the 2 attention heads"
    else:
        (model_copy / "config.json").unlink()
        needle = "is not a model directory (no config.json)"
    real = _error(preflight, load_config(overrides))  # what Run.prepare calls first
    assert needle in real, real
    assert _dry_run_error(load_config(overrides)) == real
    assert _snapshot(run_dir) == {"config.yaml": b"from an earlier run\n"}


def test_the_dry_run_plans_for_a_config_json_alone_or_a_model_not_there_yet(model_copy: Path, tmp_path: Path) -> None:
    from torchrl_post import api

    (model_copy / "model.safetensors").unlink()  # the run refuses it; the dry run sizes the model from config.json
    for path in (model_copy, tmp_path / "not_downloaded_yet"):
        cfg = load_config(
            [f"model.path={path}", f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.dry_run=true"]
        )
        assert api.run(cfg).dry_run
    cfg = load_config([f"model.path={model_copy}", f"trainer.default_local_dir={tmp_path / 'run'}"])
    assert "no *.safetensors weights" in _error(preflight, cfg)


# --- a checkpoint saved with rollout.partial_rollout the other way ------------------------------------------


@pytest.mark.parametrize("saved", [True, False])
def test_resuming_with_partial_rollout_switched_is_one_line_before_anything_is_written(
    saved: bool, model_copy: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    step = run_dir / "checkpoints" / "global_step_2"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"global_step": 2, "world_size": 1, "partial_rollout": saved}))
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2\n")
    (run_dir / "config.yaml").write_text("from the run that saved\n")
    before = _snapshot(run_dir)
    now = "false" if saved else "true"
    overrides = [f"model.path={model_copy}", f"trainer.default_local_dir={run_dir}", f"rollout.partial_rollout={now}"]
    msg = _error(preflight, load_config(overrides))
    was = "true" if saved else "false"
    assert msg.startswith(
        f"rollout.partial_rollout={now}: checkpoint {step} was saved with rollout.partial_rollout={was}"
    )
    assert f"set rollout.partial_rollout={was} again" in msg and "trainer.resume_mode=disable" in msg, msg
    assert _dry_run_error(load_config(overrides)) == msg
    assert _snapshot(run_dir) == before
    # the same setting resumes; a fresh start, or a checkpoint from before the key was saved, is not checked
    preflight(load_config([*overrides[:2], f"rollout.partial_rollout={was}"]))
    preflight(load_config([*overrides, "trainer.resume_mode=disable"]))
    (step / "trainer_state.json").write_text(json.dumps({"global_step": 2, "world_size": 1}))
    preflight(load_config(overrides))


def test_a_co_hosted_judge_names_a_model_directory(tmp_path: Path, model_copy: Path) -> None:
    judge = ["reward.judge.enable=true", "reward.weights.judge=1.0"]
    msg = _error(check_judge, load_config([*judge, f"reward.judge.model={tmp_path / 'nope'}"]))
    assert msg.startswith("reward.judge.model=") and "does not exist" in msg
    check_judge(load_config([*judge, f"reward.judge.model={model_copy}"]))
    check_judge(load_config([*judge, "reward.judge.url=http://judge:8000/v1", "reward.judge.model=served-name"]))
    # heads of 16: vLLM's CPU attention refuses them at the first request; the hf engine, or a GPU, runs them
    config = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps(config | {"head_dim": 16}))
    small = load_config([*judge, f"reward.judge.model={model_copy}", "rollout.engine=vllm"])
    msg = _error(check_judge, small)
    assert (
        msg.startswith(f"reward.judge.model='{model_copy}' has attention heads of 16")
        and "reward.judge.engine=hf" in msg
    )
    check_judge(small, device_type="cuda")
    small.reward.judge.engine = "hf"
    check_judge(small)
