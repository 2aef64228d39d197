"""Tests of torchrl_post/config/command_line.py: every peer's way of writing a command line, as overrides."""

from __future__ import annotations

from pathlib import Path

from torchrl_post.config.command_line import parse_command_line
from torchrl_post.config.load import load_command_line


def test_hydra_overrides_and_config_files_in_hydras_and_rolls_spellings() -> None:
    line = parse_command_line(["--config-path", "d", "-cn", "mine", "actor.lr=1e-4", "+x=1", "~y"])
    assert (line.config_path, line.config_name, line.overrides, line.flags) == (
        "d",
        "mine",
        ["actor.lr=1e-4", "+x=1", "~y"],
        [],
    )
    line = parse_command_line(["--config_path=dir", "--config_name", "rlvr_config"])
    assert (line.config_path, line.config_name, line.overrides) == ("dir", "rlvr_config", [])
    assert parse_command_line([]).config_name is None  # not given: the loader picks ours or a peer's base


def test_argparse_flags_become_overrides() -> None:
    line = parse_command_line(
        [
            "--learning_rate", "1e-6",
            "--use_peft",  # a bare flag is true
            "--lora_target_modules", "q_proj,", "v_proj",  # several values are a list (TRL's own example's commas)
            "--output_dir=out dir",  # inline, quoted for Hydra's grammar
            "--config", "recipe.yaml",  # TRL's flat YAML of flags
            "trainer.dry_run=true",  # an override of ours ends a flag's values
        ]
    )  # fmt: skip
    assert line.overrides == [
        "learning_rate=1e-6",
        "use_peft=true",
        "lora_target_modules=['q_proj,',v_proj]",
        "output_dir='out dir'",
        "trainer.dry_run=true",
    ]
    assert line.flags == ["learning_rate", "use_peft", "lora_target_modules", "output_dir"]
    assert line.files == ["recipe.yaml"]


def test_trls_config_file_is_read_as_its_flags(tmp_path: Path) -> None:
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text("learning_rate: 1.0e-6\nnum_generations: 4\nmax_completion_length: 32\n")
    cfg = load_command_line(["--config", str(recipe), "--num_generations", "2"])  # a flag after the file wins
    assert cfg.trainer.defaults_from == "trl" and cfg.actor.lr == 1e-6
    assert (cfg.rollout.n, cfg.data.max_response_length) == (2, 32)
