"""Tests of torchrl_post/api.py: the config from YAML, Python sections and overrides; a run's user errors and dry
run; the example scripts' ends (exit codes, one-line errors)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cmd
from torchrl_post import api
from torchrl_post.components import Given
from torchrl_post.config.errors import ConfigError, UserError
from torchrl_post.config.schema import Config, ModelConfig

ROWS = [{"prompt": "What is 1+2?", "answer": "3"}, {"prompt": "4+5=?", "answer": "9"}]


def my_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    return float(solution_str == ground_truth)


def test_config_from_yaml_sections_and_overrides() -> None:
    """YAML, then the script's sections (a dict sets its keys, a dataclass all of its section), then the
    command line's overrides, which win."""
    name = "it's a \\ name \\"
    cfg = api.config(
        ["trainer.total_training_steps=7"],
        name="lora",
        trainer={"total_training_steps": 3, "experiment_name": name, "logger": ["console"]},
        model=ModelConfig(path="m", lora_rank=4),
        data={"val_files": None, "train_files": ["a.jsonl", Path("b.jsonl")]},
    )
    assert cfg.trainer.total_training_steps == 7 and cfg.trainer.experiment_name == name
    assert cfg.model.path == "m" and cfg.model.lora_rank == 4 and cfg.model.lora_alpha == 16
    assert cfg.actor.lr == 2e-3  # configs/lora.yaml
    assert cfg.data.val_files is None and cfg.data.train_files == ["a.jsonl", "b.jsonl"]
    with pytest.raises(ConfigError, match="unknown config key 'trainer.nope'"):
        api.config(trainer={"nope": 1})


def test_section_overrides_keep_every_character() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for value in ["plain", "a'b", 'a"b', "a\\b", "a\\", "a\\'b", "x,y=z", "", "null", "1e-3", ["a,b", 1, None, True]]:
        (override,) = api.section_overrides("k", value)
        assert parser.parse_override(override).value() == value, override
    assert api.section_overrides("t", {"a": {"b": 1.5}, "c": False}) == ["t.a.b=1.5", "t.c=false"]


def test_dry_run_labels_the_objects_and_keeps_the_callers_config(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = Config()
    cfg.trainer.dry_run = True
    cfg.data.val_files = "mine/val.jsonl"
    result = api.run(cfg, Given(reward_fn=my_reward, train_data=ROWS, val_data=ROWS), notes=["from the caller"])
    assert result == api.RunResult(Path(cfg.trainer.default_local_dir), 0, dry_run=True)
    out = capsys.readouterr().out
    assert "note: from the caller\nnote: data.val_files='mine/val.jsonl' gives way to the val_data" in out
    assert "samples_per_step" in out  # the plan
    assert cfg.data.val_files == "mine/val.jsonl" and cfg.reward.function is None  # a copy was labelled


def test_a_user_error_is_reported_once_and_raised(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError) as info:
        api.run(Config(), Given(env_args={"level": 2}))
    api.report_error(info.value)  # the command line's handler: nothing more is printed
    err = capsys.readouterr().err
    assert err == "error: env_args was given without an environment: pass env_cls too (or set agent.env)\n"


def test_the_examples_end_as_the_command_line() -> None:
    """An example's dry run prints the notes and the plan (exit 0); a bad override is one line (exit 2)."""
    script = str(REPO / "examples" / "train_math_agent.py")
    proc = run_cmd([sys.executable, script, "trainer.dry_run=true"], timeout=180)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "note: data.train_files='outputs/math_agent_data/train.jsonl' gives way to the train_data" in proc.stdout
    assert "samples_per_step" in proc.stdout
    proc = run_cmd([sys.executable, str(REPO / "examples" / "train_with_lora.py"), "actor.lrr=1"], timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        "error: actor.lrr=1: unknown config key 'actor.lrr'; did you mean actor.lr? every key is in docs/config.md "
        "(verl / ROLL / TRL keys: docs/aliases.md)"
    ]


def test_only_a_scripts_hook_ends_the_process_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line ends its process itself; an uncaught crash there keeps exit code 1 (no atexit end)."""
    registered: list[Any] = []
    monkeypatch.setattr(api.atexit, "register", lambda *args: registered.append(args))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    end = api._ProcessEnd()
    end.start()
    assert not end.started and registered == []
    end.hook()
    end.start()
    assert end.started and registered == [(api.end_process, 0)] and sys.excepthook is not sys.__excepthook__


def test_a_dict_or_dictconfig_is_a_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OmegaConf DictConfig (a script's own composition, or a run's config.yaml) or a dict runs as `config(**it)`:
    its keys over configs/config.yaml, aliases and checks included."""
    from omegaconf import OmegaConf

    trainer = {"dry_run": True, "default_local_dir": str(tmp_path / "run")}
    # verl's key makes verl's defaults the base (512-token lengths: the demo model's 256 positions need shorter)
    lengths = {"max_prompt_length": 64, "max_response_length": 8}
    given = OmegaConf.create(
        {
            "trainer": trainer,
            "rollout": {"n": 4},
            "data": lengths,
            "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}},
        }
    )
    assert api.as_config(given).rollout.n == 4 and api.as_config(given).actor.lr == 1e-6
    assert api.as_config(given).trainer.defaults_from == "verl"
    assert api.train(given).dry_run and api.validate(dict(trainer=trainer)).dry_run
    structured = OmegaConf.merge(OmegaConf.structured(Config), {"trainer": trainer})
    assert api.run(structured).dry_run
    assert api.config(
        trainer=OmegaConf.create(trainer), data={"train_files": OmegaConf.create(["a.jsonl"])}
    ).trainer.dry_run
    with pytest.raises(ConfigError, match=r"^trainer.dry_rn=true: unknown config key 'trainer.dry_rn'; did you mean"):
        api.run(OmegaConf.create({"trainer": {"dry_rn": True}}))


@pytest.mark.parametrize("given", ["trainer.dry_run=true", ["trainer.dry_run=true"], None, Config])
def test_a_config_of_the_wrong_shape_is_one_line(given: Any) -> None:
    with pytest.raises(ConfigError) as info:
        api.run(given)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"the config given is a {type(given).__name__}"), msg
    assert "pass a Config (torchrl_post.api.config(overrides, name=...)" in msg


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (Given(tools=5), "tools=5 (int) is not a list of tools"),
        (Given(train_data=5), "train_data must be a list of dicts or a datasets.Dataset, got int"),
        (Given(val_data="val.jsonl"), "val_data is a path ('val.jsonl'); pass rows"),
    ],
)
def test_python_objects_of_the_wrong_shape_are_refused_by_the_dry_run_too(given: Given, line: str) -> None:
    cfg = Config()
    cfg.trainer.dry_run = True
    with pytest.raises(UserError) as info:
        api.run(cfg, given)
    assert str(info.value).startswith(line), info.value


def test_the_dry_run_imports_the_reward_function_as_the_run_does(tmp_path: Path) -> None:
    bad = tmp_path / "reward.py"
    bad.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None)\n    return 1.0\n")
    cfg = Config()
    cfg.trainer.dry_run = True
    cfg.reward.function = f"{bad}:compute_score"
    with pytest.raises(ConfigError, match=rf"^reward.function='{bad}:compute_score': module '{bad}' does not compile"):
        api.run(cfg)
