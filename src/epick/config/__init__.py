"""Loading `EndpointPickerConfig` files into a ready scheduler."""

from epick.config.errors import ConfigError, ConfigIssue
from epick.config.loaded import LoadedConfig, LoadOptions, RequestHooks
from epick.config.loader import (
    load_config,
    load_config_file,
    load_config_text,
    load_default_config,
)

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "LoadOptions",
    "LoadedConfig",
    "RequestHooks",
    "load_config",
    "load_config_file",
    "load_config_text",
    "load_default_config",
]
