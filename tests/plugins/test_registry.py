"""The plugin registry: types and their aliases, one owner per name."""

from __future__ import annotations

import pytest

from epick.config import load_config_text
from epick.plugins import in_tree_registry
from epick.plugins.registry import DuplicatePluginTypeError, PluginSpec, Registry
from epick.plugins.scorers.queue import SPEC as QUEUE


def test_an_alias_finds_its_type() -> None:
    registry = in_tree_registry()
    spec = registry.get("by-label-selector")
    assert spec is not None and spec.type == "label-selector-filter"
    assert "by-label-selector" in registry and "disagg-headers-handler" in registry.types()
    assert [s.type for s in registry].count("label-selector-filter") == 1  # each type once


def test_a_name_has_one_owner_whether_type_or_alias() -> None:
    registry = Registry()
    registry.register(PluginSpec("my-scorer", QUEUE.factory, aliases=("mine",)))
    with pytest.raises(
        DuplicatePluginTypeError, match=r"'mine' .* already registered by epick \(as a name of 'my-scorer'\)"
    ):
        registry.register(PluginSpec("other", QUEUE.factory, aliases=("mine",)), origin="pkg")
    with pytest.raises(DuplicatePluginTypeError, match="'my-scorer'"):
        registry.register(PluginSpec("mine-too", QUEUE.factory, aliases=("my-scorer",)))
    assert registry.types() == ["mine", "my-scorer"]


def test_a_plugin_built_under_an_alias_reports_its_type() -> None:
    config = load_config_text(
        """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: by-label-selector
  parameters: {matchLabels: {gpu: h100}}
- type: max-score-picker
"""
    )
    assert str(config.plugins["by-label-selector"].typed_name) == "by-label-selector/label-selector-filter"


def test_docs_plugins_names_every_in_tree_type_and_alias() -> None:
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text()
    names = [name for spec in in_tree_registry() for name in (spec.type, *spec.aliases)]
    assert [name for name in names if f"`{name}`" not in docs] == []


def test_docs_say_which_upstream_version_every_plugin_follows() -> None:
    import re
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text()
    section = docs.split("## Upstream version each plugin follows", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z0-9-]+)`", section))
    assert [spec.type for spec in in_tree_registry() if spec.type not in named] == []
