"""Plugins built by the config loader from a config that defines only them: the helpers the plugin
tests share (a bad parameter comes back as the loader's issues, with their paths)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import yaml

from epick.config import ConfigError, LoadedConfig, load_config_text
from epick.framework import Endpoint, Plugin
from epick.plugins import in_tree_registry

REGISTRY = in_tree_registry()


def load(plugins: list[dict[str, Any]], profiles: list[dict[str, Any]] | None = None) -> LoadedConfig:
    doc: dict[str, Any] = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
    }
    if profiles is not None:
        doc["schedulingProfiles"] = profiles
    return load_config_text(yaml.safe_dump(doc, sort_keys=False), source="test.yaml", registry=REGISTRY)


def make(plugin_type: str, parameters: Mapping[str, Any] | None = None, name: str = "p") -> Plugin:
    """One plugin of `plugin_type`, built by the loader from a config that defines only it."""
    entry: dict[str, Any] = {"name": name, "type": plugin_type}
    if parameters is not None:
        entry["parameters"] = dict(parameters)
    return load([entry]).plugins[name]


def issues(plugin_type: str, parameters: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """The loader's issues, (path, message, fix), for one plugin of `plugin_type`."""
    with pytest.raises(ConfigError) as e:
        make(plugin_type, parameters)
    return [(issue.path, issue.message, issue.fix) for issue in e.value.issues]


def names(endpoints: Sequence[Endpoint]) -> list[str]:
    return [ep.name for ep in endpoints]
