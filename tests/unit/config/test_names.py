"""Tests of torchrl_post/config/names.py and the image-row check of data/dataset.py: values that name something
stop the run before any model loads, with one line naming the key, the bad value and what exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, AutoTokenizer, Qwen2VLConfig

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.names import check_lora_targets, check_tool_parser
from torchrl_post.config.preflight import preflight
from torchrl_post.config.schema import Config, DataConfig
from torchrl_post.data.dataset import load_prompts

QWEN2_LINEAR = "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"


def _error(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip(), f"must be one line: {msg!r}"
    return msg


def _lora(tiny_model: Path, tmp_path: Path, targets: str) -> Config:
    return load_config(
        [
            f"model.path={tiny_model}",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "model.lora_rank=8",
            f"model.target_modules={targets}",
        ]
    )


# --- model.target_modules -----------------------------------------------------------------------------------


def test_unknown_lora_target_is_named_with_the_linear_modules(tiny_model: Path, tmp_path: Path) -> None:
    msg = _error(preflight, _lora(tiny_model, tmp_path, "[no_such_proj]"))
    assert msg == (
        "model.target_modules=['no_such_proj']: no linear module of qwen2 is named no_such_proj; "
        f"its linear modules are: {QWEN2_LINEAR} (or all-linear)"
    )
    # every entry must name one (PEFT itself would adapt q_proj and drop the typo silently)
    msg = _error(preflight, _lora(tiny_model, tmp_path, "[q_proj,v_prj]"))
    assert msg.startswith("model.target_modules=['q_proj', 'v_prj']: no linear module of qwen2 is named v_prj;")


def test_valid_lora_targets_pass(tiny_model: Path, tmp_path: Path) -> None:
    cfg = _lora(tiny_model, tmp_path, "[q_proj,v_proj]")
    assert preflight(cfg).model_type == "qwen2"
    model_config = AutoConfig.from_pretrained(tiny_model)
    for targets in ("all-linear", "ALL-LINEAR", r".*\.(q|v)_proj", ["self_attn.o_proj"], ["lm_head"]):
        cfg.model.target_modules = targets
        check_lora_targets(cfg, model_config)


def test_lora_target_regex(tiny_model: Path, tmp_path: Path) -> None:
    cfg = _lora(tiny_model, tmp_path, "[q_proj]")
    model_config = AutoConfig.from_pretrained(tiny_model)
    cfg.model.target_modules = r".*\.no_such"
    assert _error(check_lora_targets, cfg, model_config) == (
        r"model.target_modules='.*\\.no_such': a string is a regular expression full-matched against module "
        "names, and this one matches no linear module of qwen2 (such as model.layers.0.self_attn.q_proj); "
        f"its linear modules are: {QWEN2_LINEAR} (or all-linear)"
    )
    cfg.model.target_modules = "q_proj"  # PEFT full-matches a string: a bare name matches nothing
    assert "(for the modules named q_proj give a list: [q_proj])" in _error(check_lora_targets, cfg, model_config)
    cfg.model.target_modules = "(q_proj"
    assert _error(check_lora_targets, cfg, model_config).startswith(
        "model.target_modules='(q_proj' is not a valid regular expression ("
    )


def test_lora_target_that_is_not_linear(tiny_model: Path, tmp_path: Path) -> None:
    cfg = _lora(tiny_model, tmp_path, "[embed_tokens]")
    assert "no linear module of qwen2 is named embed_tokens;" in _error(preflight, cfg)
    cfg.model.target_modules = r"model\.layers\.0\..*"  # the attention block itself matches too
    assert _error(check_lora_targets, cfg, AutoConfig.from_pretrained(tiny_model)) == (
        r"model.target_modules='model\\.layers\\.0\\..*' matches model.layers.0.self_attn (Qwen2Attention), "
        f"not a linear module: LoRA here adapts nn.Linear modules only; its linear modules are: {QWEN2_LINEAR} "
        "(or all-linear)"
    )


def test_lora_targets_of_a_vision_language_model_leave_out_its_vision_tower(tiny_model: Path, tmp_path: Path) -> None:
    cfg = _lora(tiny_model, tmp_path, "[q_proj,v_proj]")
    vl = Qwen2VLConfig()  # a 7B architecture: built on the meta device, so no memory
    check_lora_targets(cfg, vl)
    cfg.model.target_modules = ["qkv"]  # the vision tower's attention: excluded from the adapter
    assert _error(check_lora_targets, cfg, vl) == (
        "model.target_modules=['qkv']: no linear module of qwen2_vl (outside its vision tower) is named qkv; "
        f"its linear modules are: {QWEN2_LINEAR} (or all-linear)"
    )


def test_lora_targets_unchecked_without_lora(tiny_model: Path, tmp_path: Path) -> None:
    cfg = load_config(
        [f"model.path={tiny_model}", f"trainer.default_local_dir={tmp_path}", "model.target_modules=[no_such_proj]"]
    )
    preflight(cfg)  # model.lora_rank=0: no adapter, nothing to match


# --- agent.tool_parser --------------------------------------------------------------------------------------


def _agent(tiny_model: Path, tmp_path: Path, *extra: str) -> Config:
    env = [
        "agent.env=torchrl_post.agent.guess_number:GuessNumberEnv",
        "agent.agent=torchrl_post.agent.guess_number:GuessAgent",
    ]
    return load_config([f"model.path={tiny_model}", f"trainer.default_local_dir={tmp_path}", *env, *extra])


def test_unknown_tool_parser(tiny_model: Path, tmp_path: Path) -> None:
    from torchrl_post.engines.vllm import tool_parser_names

    names = tool_parser_names()
    assert "hermes" in names
    msg = _error(preflight, _agent(tiny_model, tmp_path, "agent.tool_parser=no_such_parser"))
    assert msg == f"agent.tool_parser='no_such_parser' is not one of vLLM's tool parsers: {', '.join(names)}"
    # without tools too: the name is checked whenever agent.env is set
    assert "agent.tool_parser='no_such_parser'" in _error(
        check_tool_parser, _agent(tiny_model, tmp_path, "agent.tool_parser=no_such_parser", "agent.tools=[]")
    )


def test_known_tool_parser_and_no_agent_pass(tiny_model: Path, tmp_path: Path) -> None:
    check_tool_parser(_agent(tiny_model, tmp_path, "agent.tool_parser=hermes", "agent.tools=[calculator]"))
    plain = load_config(
        [f"model.path={tiny_model}", f"trainer.default_local_dir={tmp_path}", "agent.tool_parser=no_such_parser"]
    )
    check_tool_parser(plain)  # no agent.env: nothing parses tool calls


# --- data.image_key with a text-only model ------------------------------------------------------------------


def _rows(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_rows_with_images_for_a_text_only_model(tiny_model: Path, tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    path = _rows(
        tmp_path / "train.jsonl",
        [
            {"prompt": "1+1=", "answer": "2"},
            {"prompt": "2+2=", "answer": "4", "images": []},
            {"prompt": "<image>colour?", "answer": "red", "images": ["red.png"]},
        ],
    )
    expected = (
        f"{path} row 3 has images (data.image_key='images') but model.path={str(tiny_model)!r} is a text-only "
        "model; use a vision-language model or drop the column / set data.image_key to a column that does not exist"
    )
    assert _error(load_prompts, [path], DataConfig(), tok, "train") == expected
    # a config fault, not a bad row: data.skip_bad_rows does not skip it
    assert _error(load_prompts, [path], DataConfig(skip_bad_rows=True), tok, "train") == expected
    # the caller's label for the model
    msg = _error(load_prompts, [path], DataConfig(), tok, "train", model="model.path='/m' (qwen2)")
    assert "but model.path='/m' (qwen2) is a text-only model;" in msg
    # a column the rows do not have: the images are not read, as documented
    assert len(load_prompts([path], DataConfig(image_key="no_such_column"), tok, "train")) == 3


def test_rows_without_images_pass(tiny_model: Path, tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = [{"prompt": "1+1=", "answer": "2", "images": v} for v in (None, [], "", [None])]
    assert len(load_prompts([_rows(tmp_path / "t.jsonl", rows)], DataConfig(), tok, "train")) == 4
