"""Everything fed wrong: override syntax, config values, placement ranks, the device, reward modules and data
rows. Each is one line naming the key, module, file or line, before any model loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_cmd
from torchrl_post.config.errors import ConfigError, DataError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import DataConfig, PlacementConfig
from torchrl_post.data.dataset import load_prompts, read_rows
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.distributed.env import read_env
from torchrl_post.distributed.placement import plan_placement
from torchrl_post.reward import resolve_reward_fn


def _one_line(exc: pytest.ExceptionInfo[Any]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg.strip(), f"must be one line: {msg!r}"
    return msg


def _config_error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    return _one_line(info)


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
        ("critic.lr_warmup_steps=-1", "critic.lr_warmup_steps"),
        ("actor.clip_ratio_low=-0.1", "actor.clip_ratio_low"),
        ("rollout.max_num_seqs=0", "rollout.max_num_seqs=0 must be > 0"),
        ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization=1.5 must be in (0, 1]"),
        ("rollout.load_format=lazy", "rollout.load_format"),
        ("model.load_format=mmap", "model.load_format"),
    ],
)
def test_config_values_checked(override: str, needle: str) -> None:
    assert needle in _config_error([override])


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


# --- placement ranks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [[2, "x"], [0.5], [True], [1, None]])
def test_non_integer_rank(ranks: list[Any]) -> None:
    with pytest.raises(ConfigError) as info:
        plan_placement(PlacementConfig(actor=[0, 1], rollout=ranks), 4)
    msg = _one_line(info)
    assert msg.startswith("placement.rollout=") and f"rank {ranks[-1]!r} is not an integer" in msg


def _dry_run(*overrides: str) -> Any:
    return run_cmd([sys.executable, "-m", "torchrl_post.train", "trainer.dry_run=true", *overrides], timeout=120)


def _one_error_line(proc: Any, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr[-3000:]


def test_entrypoint_non_integer_rank_is_one_line() -> None:
    _one_error_line(_dry_run("trainer.world_size=3", "placement.rollout=[2,x]"), "rank 'x' is not an integer")


# --- the device ---------------------------------------------------------------------------------------------


def test_cuda_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        read_env("cuda")
    msg = _one_line(info)
    assert "trainer.device=cuda" in msg and "no CUDA device is visible" in msg and "trainer.device=cpu" in msg
    assert read_env("auto").device.type == "cpu"


def test_more_local_ranks_than_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as info:
        read_env("cuda")
    assert "LOCAL_RANK=1 but only 1 CUDA device(s) are visible" in _one_line(info)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here")
def test_entrypoint_cuda_without_a_gpu() -> None:
    _one_error_line(_dry_run("trainer.device=cuda"), "no CUDA device is visible; use trainer.device=cpu or auto")


# --- reward modules -----------------------------------------------------------------------------------------


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _reward_error(function: str) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_reward_fn(function, {"arithmetic"})
    return _one_line(info)


def test_reward_module_with_a_syntax_error(module_dir: Path) -> None:
    (module_dir / "rw_syntax.py").write_text("def score(a, b, c, d=None):\n    return (1\n\nx = 1\n")
    msg = _reward_error("rw_syntax:score")
    assert msg.startswith("reward.function='rw_syntax:score': module 'rw_syntax' does not compile")
    assert f"{module_dir / 'rw_syntax.py'}:2" in msg


def test_reward_module_raising_at_import(module_dir: Path) -> None:
    (module_dir / "rw_raises.py").write_text("import os\n\nTABLE = {}\nLIMIT = TABLE['limit']\n")
    msg = _reward_error("rw_raises:score")
    assert "importing module 'rw_raises' raised KeyError: 'limit'" in msg
    assert f"{module_dir / 'rw_raises.py'}:4" in msg
    (module_dir / "rw_lib.py").write_text("import json\n\nCONFIG = json.loads('{oops')\n")
    msg = _reward_error("rw_lib:score")
    assert "raised JSONDecodeError" in msg and f"{module_dir / 'rw_lib.py'}:3" in msg  # the user's line, not json's
    (module_dir / "rw_exits.py").write_text("import sys\nsys.exit('no GPU for my reward')\n")
    assert "raised SystemExit: no GPU for my reward" in _reward_error("rw_exits:score")


def test_reward_module_missing_dependency(module_dir: Path) -> None:
    (module_dir / "rw_dep.py").write_text("import no_such_dependency_xyz\n")
    msg = _reward_error("rw_dep:score")
    assert "cannot import module 'rw_dep'" in msg and "no_such_dependency_xyz" in msg


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def score(solution_str, ground_truth):\n    return 1.0\n", "too many positional arguments"),
        ("def score(a, b, c, d, *, strict):\n    return 1.0\n", "missing a required argument: 'strict'"),
        ("def score(a, b, c, d, e):\n    return 1.0\n", "missing a required argument: 'e'"),
        ("def score(**kwargs):\n    return 1.0\n", "too many positional arguments"),
    ],
)
def test_reward_signature_that_cannot_take_verls_arguments(module_dir: Path, source: str, needle: str) -> None:
    name = f"rw_sig_{abs(hash(source))}"
    (module_dir / f"{name}.py").write_text(source)
    msg = _reward_error(f"{name}:score")
    assert "cannot take verl's four arguments (data_source, solution_str, ground_truth, extra_info)" in msg
    assert needle in msg


def test_async_reward_function(module_dir: Path) -> None:
    (module_dir / "rw_async.py").write_text("async def score(a, b, c, d=None):\n    return 1.0\n")
    assert "is an async function" in _reward_error("rw_async:score")


@pytest.mark.parametrize(
    "source",
    [
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
        "def score(*args):\n    return 1.0\n",
        "def score(a, b, c, d, e=0, **kw):\n    return 1.0\n",
        "class Score:\n    def __call__(self, a, b, c, d):\n        return 1.0\nscore = Score()\n",
    ],
)
def test_reward_signatures_that_fit(module_dir: Path, source: str) -> None:
    name = f"rw_ok_{abs(hash(source))}"
    (module_dir / f"{name}.py").write_text(source)
    fn = resolve_reward_fn(f"{name}:score", {"arithmetic"})("arithmetic")
    assert fn("arithmetic", "4", "4", {}) == 1.0


@pytest.mark.parametrize("function", [":score", "tests.unit.reward_helpers:"])
def test_reward_path_with_an_empty_side(function: str) -> None:
    assert "must look like package.module:function" in _reward_error(function)


# --- data rows ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_char_tokenizer()


def _data_error(files: list[Path], cfg: DataConfig, tok: Any) -> str:
    with pytest.raises(DataError) as info:
        load_prompts([str(f) for f in files], cfg, tok, "train")
    return _one_line(info)


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_csv_row_with_a_missing_field(tmp_path: Path, tok: Any) -> None:
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer,data_source\n1+1,2,arithmetic\n"multi\nline",3,arithmetic\n2+2\n3+3,6,arithmetic\n')
    with pytest.raises(DataError) as info:
        read_rows(path)
    msg = _one_line(info)
    assert f"{path}:5:" in msg and "1 field(s) where the header has 3" in msg
    assert "no value for 'answer', 'data_source'" in msg
    ds = load_prompts([str(path)], DataConfig(skip_bad_rows=True), tok, "train")
    assert ds.answers == ["2", "3", "6"] and ds.num_bad == 1


def test_csv_row_with_an_extra_field(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\n1+1,2\nAdd 1, 2 and 3,6\n")
    with pytest.raises(DataError) as info:
        read_rows(path)
    msg = _one_line(info)
    assert f"{path}:3:" in msg and "3 field(s) where the header has 2" in msg and "quote" in msg


def test_csv_empty_quoted_field_is_read_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer,note\n1+1,2,""\n\n2+2,4,\n')
    assert read_rows(path) == [
        {"prompt": "1+1", "answer": "2", "note": ""},
        {"prompt": "2+2", "answer": "4", "note": ""},
    ]


def test_csv_header_problems(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer,answer\n1+1,2,3\n")
    with pytest.raises(DataError, match=r"d.csv:1: the header names column\(s\) \['answer'\] twice"):
        read_rows(path)
    path.write_text("")
    with pytest.raises(DataError, match="empty CSV file"):
        read_rows(path)


def test_csv_row_errors_name_the_line(tmp_path: Path, tok: Any) -> None:
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer\n"a\nb",1\n2+2,\n')
    msg = _data_error([path], DataConfig(), tok)
    assert f"{path} line 4: empty 'answer'" in msg


def test_unknown_chat_role(tmp_path: Path, tok: Any) -> None:
    good = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1"}]
    bad = [{"role": "user", "content": "1+1"}, {"role": "human", "content": "2+2"}]
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": good, "answer": "2"}, {"prompt": bad, "answer": "4"}])
    msg = _data_error([path], DataConfig(), tok)
    assert f"{path} row 2: column 'prompt' message 2 has role 'human'" in msg
    assert "system, user, assistant, tool" in msg
    ds = load_prompts([str(path)], DataConfig(skip_bad_rows=True), tok, "train")
    assert len(ds) == 1 and ds.num_bad == 1


def test_unknown_role_in_messages_column(tmp_path: Path, tok: Any) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "User", "content": "1+1"}], "answer": "2"}])
    assert "column 'messages' message 1 has role 'User'" in _data_error([path], DataConfig(), tok)


def test_tool_and_assistant_roles_are_fine(tmp_path: Path, tok: Any) -> None:
    msgs = [
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "calc"},
        {"role": "tool", "content": "2"},
        {"role": "user", "content": "so?"},
    ]
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": msgs, "answer": "2"}])
    assert len(load_prompts([str(path)], DataConfig(max_prompt_length=256), tok, "train")) == 1


def test_every_message_empty(tmp_path: Path, tok: Any) -> None:
    msgs = [{"role": "system", "content": ""}, {"role": "user", "content": "  "}]
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": msgs, "answer": "2"}])
    assert "every message in column 'prompt' is empty" in _data_error([path], DataConfig(), tok)


@pytest.mark.parametrize("answer", ["", "  \n"])
def test_empty_answer(tmp_path: Path, tok: Any, answer: str) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, {"prompt": "2+2", "answer": answer}])
    msg = _data_error([path], DataConfig(), tok)
    assert f"{path} row 2: empty 'answer'" in msg and "data.skip_bad_rows=true" in msg
    assert load_prompts([str(path)], DataConfig(skip_bad_rows=True), tok, "train").num_bad == 1


@pytest.mark.parametrize("source", [0, False, 3.5, ["a"]])
def test_data_source_that_is_not_a_string(tmp_path: Path, tok: Any, source: Any) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2", "data_source": source}])
    msg = _data_error([path], DataConfig(), tok)
    assert f"{path} row 1: column 'data_source' must be a string, got {type(source).__name__}" in msg


def test_empty_data_source_takes_the_default(tmp_path: Path, tok: Any) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2", "data_source": ""}])
    assert load_prompts([str(path)], DataConfig(), tok, "train").data_sources == ["arithmetic"]


def test_extra_info_that_is_not_an_object(tmp_path: Path, tok: Any) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2", "extra_info": '{"id": 1}'}])
    msg = _data_error([path], DataConfig(), tok)
    assert "column 'extra_info' must be an object" in msg and "got str" in msg


def test_jsonl_row_named_by_its_line_when_they_differ(tmp_path: Path, tok: Any) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+1", "answer": "2"}) + "\n\n" + json.dumps({"prompt": "2+2"}) + "\n")
    assert f"{path} row 2 (line 3): no 'answer' column" in _data_error([path], DataConfig(), tok)
