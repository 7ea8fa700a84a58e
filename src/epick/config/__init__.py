"""Loading `EndpointPickerConfig` files into a ready scheduler."""

from epick.config.errors import ConfigError, ConfigIssue
from epick.config.loader import (
    LoadedConfig,
    RequestHooks,
    load_config_file,
    load_config_text,
    load_default_config,
)

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "LoadedConfig",
    "RequestHooks",
    "load_config_file",
    "load_config_text",
    "load_default_config",
]
