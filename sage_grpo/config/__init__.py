"""Configuration: typed dataclass schemas, YAML + CLI resolution, and validity rules."""

from sage_grpo.config.schema import config_field, parse_cli, save_yaml, str_to_bool, to_dict
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import ConfigError, validate_train_config

__all__ = ["config_field", "parse_cli", "save_yaml", "str_to_bool", "to_dict", "TrainConfig", "ConfigError",
           "validate_train_config"]
