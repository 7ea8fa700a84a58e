"""Building a validated config document into a `LoadedConfig`, in steps, one module each:

1. `sections`: feature gates, sections epick does not use, and the profiles' references;
2. `plugins`: every plugin, by its type's spec (the data producers plugins read added first);
3. `profiles`: the scheduling profiles and the profile handler;
4. `parsers`, `flow_control` and the data layer (`epick.config.datalayer`): what the rest of the
   service runs with.

Every problem of a step is collected before failing; phase 1 (the sections, and indexing the
plugins) and phase 2 (building) are both reported at once, each problem naming its path in the file
and a fix. Nothing half-built is returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epick.config.build import sections
from epick.config.build.flow_control import build_flow_control, saturation_detector
from epick.config.build.parsers import build_parsers
from epick.config.build.plugins import DEFAULT_PLUGIN_STATE_STALENESS, PluginBuilder
from epick.config.build.profiles import assemble
from epick.config.datalayer import DataLayerBuilder
from epick.config.loaded import LoadedConfig, RequestHooks
from epick.config.schema import EndpointPickerConfigFile
from epick.framework import Clock, Scheduler
from epick.plugins.registry import Registry

__all__ = ["build_config"]


def build_config(
    source: str,
    doc: EndpointPickerConfigFile,
    registry: Registry,
    *,
    seed: int | None = None,
    load_failures: list[str] | None = None,
    previous: LoadedConfig | None = None,
    clock: Clock | None = None,
    workers: int = 1,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    allow_experimental: bool = True,
    plugin_state_staleness: float = DEFAULT_PLUGIN_STATE_STALENESS,
) -> LoadedConfig:
    """Build `doc` (read from `source`) with the plugin types of `registry`. With `previous` (the
    running config), unchanged plugins are its instances. The factories get `clock` and `workers`
    from their handle; `overrides` replace parameters by plugin type. Raises `ConfigError` naming
    every problem."""
    b = PluginBuilder(
        source,
        doc,
        registry,
        seed,
        load_failures or [],
        previous=previous,
        clock=clock,
        workers=workers,
        overrides=overrides,
        plugin_state_staleness=plugin_state_staleness,
    )
    # Phase 1: names, types, references.
    b.index_plugins()
    b.add_required_producers()
    sections.check_profile_refs(b)
    sections.ignored_section_warnings(b)
    sections.feature_gate_warnings(b)
    # Phase 2: every plugin (also when phase 1 found problems, to report all at once), then the rest.
    for name in b.entries:
        b.instantiate(name)
    if not allow_experimental:
        sections.refuse_experimental(b)
    b.check()
    profiles, handler = assemble(b)
    detector = saturation_detector(b)
    flow_control = build_flow_control(b)
    parsers = build_parsers(b)
    data_layer = DataLayerBuilder(doc, b.instances, b.fail, b.warnings.append, b.default_instance).build()
    b.check()
    assert handler is not None
    return LoadedConfig(
        source=source,
        scheduler=Scheduler(profiles, handler),
        plugins=dict(b.instances),
        hooks=RequestHooks.from_plugins(list(b.instances.values())),
        saturation_detector=detector,
        flow_control=flow_control,
        parsers=parsers,
        data_layer=data_layer,
        warnings=b.warnings,
        fingerprints=dict(b.fingerprints),
        uses={name: frozenset(used) for name, used in b.uses.items()},
        clock=b.clock,
        workers=workers,
        worker_states=dict(b.worker_states),
    )
