"""Where the shipped YAML configs are (configs/config.yaml and the peers' bases): one answer for the loader and the
alias table's conversions that read a base's values."""

from __future__ import annotations

from pathlib import Path

from torchrl_post.config.errors import ConfigError


def default_config_dir() -> Path:
    """The shipped YAML configs: `torchrl_post/configs/` inside an installed wheel (setup.py copies the repository's
    `configs/` there at build time), else `configs/` at the root of the source checkout (editable installs)."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "configs", package.parent / "configs"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise ConfigError(
        f"the default YAML configs are missing: neither {package / 'configs'} (an installed wheel) nor "
        f"{package.parent / 'configs'} (a source checkout) has config.yaml"
    )
