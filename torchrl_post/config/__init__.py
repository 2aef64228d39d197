"""Config schema (dataclasses), loading (Hydra compose) and validation."""

from torchrl_post.config.errors import ConfigError, DataError, UserError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import Config

__all__ = ["Config", "ConfigError", "DataError", "UserError", "load_config"]
