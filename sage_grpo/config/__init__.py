"""Configuration: typed dataclass schemas, YAML + CLI resolution, and validity rules. The training configuration
is ``sage_grpo.config.train.TrainConfig`` (imported from there by the few modules that build or parse it)."""

from sage_grpo.config.schema import config_field, parse_cli, save_yaml, str_to_bool, to_dict
from sage_grpo.config.validation import ConfigError, validate_train_config

__all__ = ["config_field", "parse_cli", "save_yaml", "str_to_bool", "to_dict", "ConfigError", "validate_train_config"]
