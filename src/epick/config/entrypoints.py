"""Out-of-tree plugins: installed distributions register types through entry-point group `epick.plugins`.

An entry point names either a `PluginSpec`, a list of them, or a function taking the `Registry`.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points

from epick.plugins import in_tree_registry
from epick.plugins.registry import PluginSpec, Registry

GROUP = "epick.plugins"


def load_entry_points(registry: Registry) -> list[str]:
    """Register every installed out-of-tree plugin; returns a message per entry point that failed."""
    failures = []
    for ep in entry_points(group=GROUP):
        origin = f"entry point {ep.name!r} ({ep.value})"
        try:
            target = ep.load()
            if isinstance(target, PluginSpec):
                registry.register(target, origin=origin)
            elif callable(target):
                target(registry)
            elif isinstance(target, Iterable):
                for spec in target:
                    if not isinstance(spec, PluginSpec):
                        raise TypeError(f"{spec!r} is not a PluginSpec")
                    registry.register(spec, origin=origin)
            else:
                raise TypeError("must name a PluginSpec, a list of them, or a function taking the Registry")
        except Exception as e:  # a broken plugin package must not stop configs that do not use it
            failures.append(f"{origin} failed to load: {type(e).__name__}: {e}")
    return failures


def default_registry() -> tuple[Registry, list[str]]:
    """In-tree plugins plus every installed out-of-tree one, and the load failures."""
    registry = in_tree_registry()
    return registry, load_entry_points(registry)
