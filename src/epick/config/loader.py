"""Load an `EndpointPickerConfig` into a ready scheduler, request-control hooks and the settings the
service runs with.

As the Go EPP's loader: read and validate the document (`epick.config.read`), then build it
(`epick.config.build`: sections, plugins, profiles, parsers, flow control, data layer). Every problem
is reported with the file, the path inside it and a fix; nothing half-built is returned. The result
is a `LoadedConfig` (`epick.config.loaded`).
"""

from __future__ import annotations

from pathlib import Path

from epick.config.build import build_config
from epick.config.defaults import DEFAULT_CONFIG_YAML
from epick.config.entrypoints import default_registry
from epick.config.loaded import LoadedConfig, LoadOptions
from epick.config.read import parse_document, read_text
from epick.plugins.registry import Registry


def load_config(
    path: str | Path | None,
    *,
    seed: int | None = None,
    registry: Registry | None = None,
    previous: LoadedConfig | None = None,
    options: LoadOptions | None = None,
) -> LoadedConfig:
    """The config file at `path`, or the built-in default config when `path` is None.

    With `previous` (the running config, on a reload), a plugin whose name, type and parameters did
    not change, and that uses no other plugin, is the running instance itself: it keeps its state
    (the prefix index, requests in flight, an LRU order). `options`: what the service gives the
    plugins beyond the file (their clock, the worker count, parameter overrides).
    """
    if path is None:
        return load_default_config(registry=registry, seed=seed, previous=previous, options=options)
    return load_config_file(path, registry=registry, seed=seed, previous=previous, options=options)


def load_config_file(
    path: str | Path,
    *,
    registry: Registry | None = None,
    seed: int | None = None,
    previous: LoadedConfig | None = None,
    options: LoadOptions | None = None,
) -> LoadedConfig:
    text = read_text(path)
    return load_config_text(
        text, source=str(path), registry=registry, seed=seed, previous=previous, options=options
    )


def load_default_config(
    *,
    registry: Registry | None = None,
    seed: int | None = None,
    previous: LoadedConfig | None = None,
    options: LoadOptions | None = None,
) -> LoadedConfig:
    return load_config_text(
        DEFAULT_CONFIG_YAML,
        source="<default config>",
        registry=registry,
        seed=seed,
        previous=previous,
        options=options,
    )


def load_config_text(
    text: str,
    *,
    source: str = "<config>",
    registry: Registry | None = None,
    seed: int | None = None,
    previous: LoadedConfig | None = None,
    options: LoadOptions | None = None,
) -> LoadedConfig:
    load_failures: list[str] = []
    if registry is None:
        registry, load_failures = default_registry()
    document = parse_document(text, source)
    options = options or LoadOptions()
    if options.feature_gates:
        gates = [*document.feature_gates, *options.feature_gates]
        document = document.model_copy(update={"feature_gates": gates})
    return build_config(
        source,
        document,
        registry,
        seed=seed,
        load_failures=load_failures,
        previous=previous,
        clock=options.clock,
        workers=options.workers,
        overrides=options.overrides,
        allow_experimental=options.allow_experimental,
        plugin_state_staleness=options.plugin_state_staleness,
    )
