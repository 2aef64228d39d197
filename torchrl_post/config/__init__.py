"""Config schema (dataclasses), loading (Hydra compose) and validation.

`load_config` is imported on first use: it brings Hydra, and the validator imports `algos/`, whose modules import
`config.enums` / `config.errors` back, so importing this package must not import them.
"""

from typing import Any

from torchrl_post.config.errors import ConfigError, DataError, UserError
from torchrl_post.config.schema import Config

__all__ = ["Config", "ConfigError", "DataError", "UserError", "load_config"]


def __getattr__(name: str) -> Any:
    if name == "load_config":
        from torchrl_post.config.load import load_config

        return load_config
    raise AttributeError(name)
