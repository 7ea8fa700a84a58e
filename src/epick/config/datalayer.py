"""The `dataLayer` section: which sources poll or notify, which extractors read them, and discovery.

Defaults as upstream's loaders (`ensureDataLayer`): under llm-d's apiVersion (llm-d/llm-d-router,
pkg/epp/config/loader/defaults.go) a `metrics-data-source` with a `core-metrics-extractor` is added
unless `injectDefaults: false` or a source already refers to a plugin named `metrics-data-source`;
under GIE's (gateway-api-inference-extension v1.5.0, same file) only when the section is absent. An
extractor that reads endpoints (`topology-extractor`) and is bound to no source is wired to endpoint
notifications, as upstream's registrants are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from epick.config.schema import DataLayerSection, DataLayerSource, EndpointPickerConfigFile
from epick.framework import Plugin
from epick.framework.datalayer import (
    CoreMetricsReader,
    CrossReplicaSyncer,
    EndpointExtractor,
    EndpointNotificationSource,
    EndpointsFileDiscovery,
    GatewayPollingSource,
    PollingExtractor,
    PollingSource,
    ResourceNotificationSource,
)

METRICS_SOURCE = "metrics-data-source"
DEFAULT_SYNC_INTERVAL = 0.2  # seconds: upstream's defaultCrossReplicaSyncInterval
CORE_EXTRACTOR = "core-metrics-extractor"
LLMD_GROUP = "llm-d.ai/"
V1 = "llm-d.ai/v1"
V1ALPHA1 = "llm-d.ai/v1alpha1"


@dataclass(frozen=True, slots=True)
class PolledSource:
    """A polling source and the extractors that read its payload, in the order configured."""

    source: PollingSource
    extractors: tuple[PollingExtractor, ...]

    @property
    def reads_core_metrics(self) -> bool:
        return any(isinstance(e, CoreMetricsReader) for e in self.extractors)


@dataclass(frozen=True, slots=True)
class DataLayerPlan:
    """What the service's data layer runs for a config."""

    polled: tuple[PolledSource, ...] = ()
    endpoint_extractors: tuple[EndpointExtractor, ...] = ()
    discovery: EndpointsFileDiscovery | None = None
    injected: bool = False  # the default metrics source was added by the loader
    fingerprint: str = field(default="", compare=False)
    # `crossReplicaSyncerPluginRef` and `crossReplicaSyncInterval` (upstream's default 200 ms)
    syncer: CrossReplicaSyncer | None = None
    sync_interval: float = DEFAULT_SYNC_INTERVAL

    @property
    def scrapes_core_metrics(self) -> bool:
        return any(p.reads_core_metrics for p in self.polled)


def _is_data_plugin(plugin: Plugin) -> bool:
    """A plugin that does nothing unless a data-layer source lists it (one that says it works
    unlisted, `works_unlisted`, is not)."""
    if getattr(plugin, "works_unlisted", False):
        return False
    return isinstance(
        plugin,
        PollingSource
        | PollingExtractor
        | EndpointNotificationSource
        | EndpointExtractor
        | ResourceNotificationSource
        | EndpointsFileDiscovery,
    )


class DataLayerBuilder:
    """Resolves the section against the built plugins; `fail(path, message, fix)` reports problems,
    `make(type)` builds a default instance of a type (for the injected defaults)."""

    def __init__(
        self,
        doc: EndpointPickerConfigFile,
        instances: dict[str, Plugin],
        fail: Callable[[str, str, str], None],
        warn: Callable[[str], None],
        make: Callable[[str], Plugin | None],
    ) -> None:
        self.doc = doc
        self.instances = instances
        self.fail = fail
        self.warn = warn
        self.make = make

    def section(self) -> tuple[str, DataLayerSection | None]:
        if self.doc.data is not None and self.doc.data_layer is not None:
            self.fail(
                "data",
                "both 'data' and 'dataLayer' are given",
                "keep 'dataLayer' ('data' is GIE v1.3-1.4's name for it)",
            )
        if self.doc.data_layer is not None:
            return "dataLayer", self.doc.data_layer
        if self.doc.data is not None:
            return "data", self.doc.data
        return "dataLayer", None

    def build(self) -> DataLayerPlan:
        where, section = self.section()
        sources = list(section.sources) if section is not None else []
        injected = self._inject(section, sources)
        polled: list[PolledSource] = []
        endpoint_extractors: list[EndpointExtractor] = []
        bound: set[str] = set()
        for i, src in enumerate(sources):
            path = f"{where}.sources[{i}]" if i < len(section.sources if section else []) else where
            result = self._source(path, src, bound)
            if isinstance(result, PolledSource):
                if any(p.source is result.source for p in polled):
                    self.fail(
                        f"{path}.pluginRef", f"source {src.plugin_ref!r} is listed twice", "list it once"
                    )
                    continue
                polled.append(result)
            elif result is not None:
                endpoint_extractors.extend(result)
        for name, plugin in self.instances.items():
            if isinstance(plugin, EndpointExtractor) and name not in bound:
                endpoint_extractors.append(plugin)  # upstream's registrants wire themselves
                bound.add(name)
        discovery = self._discovery(where, section)
        syncer = self._syncer(where, section)
        if section is not None:
            self._unsupported(where, section)
        for name, plugin in self.instances.items():
            if _is_data_plugin(plugin) and name not in bound and plugin is not discovery:
                self.warn(
                    f"plugin {name!r} ({plugin.typed_name.type}) is not used: no {where} source lists it"
                )
        self._check_consumers(polled)
        core = [p for p in polled if p.reads_core_metrics]
        if len(core) > 1:
            names = ", ".join(repr(p.source.typed_name.name) for p in core)
            self.warn(
                f"{where}: {len(core)} sources feed a core-metrics extractor ({names}): each one's failures "
                "mark an endpoint unhealthy; keep one (upstream adds 'metrics-data-source' unless a source "
                "refers to that name, or injectDefaults is false)"
            )
        if not polled and section is not None and not injected:
            self.warn(f"{where} has no polling source: no endpoint metrics are scraped")
        # The plugin objects themselves: a reload keeps an unchanged plugin's instance and builds a
        # new one for changed parameters, so equal identities mean nothing to restart.
        fingerprint = repr(
            (
                [(id(p.source), [id(e) for e in p.extractors]) for p in polled],
                [id(e) for e in endpoint_extractors],
                id(discovery) if discovery else 0,
            )
        )
        interval = DEFAULT_SYNC_INTERVAL
        if section is not None and section.sync_interval is not None:
            interval = section.sync_interval
            if interval <= 0:  # upstream: a non-positive interval falls back to the default
                interval = DEFAULT_SYNC_INTERVAL
        return DataLayerPlan(
            tuple(polled), tuple(endpoint_extractors), discovery, injected, fingerprint, syncer, interval
        )

    def _check_consumers(self, polled: list[PolledSource]) -> None:
        """A plugin that reads attributes no bound extractor produces is an error (upstream's loader
        fails on a consumed data key without a producer)."""
        produced = {
            key for p in polled for e in p.extractors for key in getattr(e, "produces_attributes", ())
        }
        for i, entry in enumerate(self.doc.plugins):
            plugin = self.instances.get(entry.name or entry.type)
            for key in sorted(getattr(plugin, "consumes_attributes", ())):
                if key not in produced:
                    assert plugin is not None
                    self.fail(
                        f"plugins[{i}]",
                        f"plugin {plugin.typed_name.name!r} ({plugin.typed_name.type}) reads attribute "
                        f"{key!r}, which no extractor of the data layer produces",
                        "bind an extractor that produces it to a source under dataLayer.sources "
                        "(for the multicluster scorers: multicluster-metrics-extractor on "
                        "multicluster-metrics-data-source)",
                    )

    def _inject(self, section: DataLayerSection | None, sources: list[DataLayerSource]) -> bool:
        if any(isinstance(self.instances.get(s.plugin_ref), GatewayPollingSource) for s in sources):
            # Peer clusters' gateways serve no model-server metrics: the default core-metrics source
            # would only fail against them (upstream injects it anyway; its failures are logged).
            return False
        llmd = self.doc.api_version.startswith(LLMD_GROUP)
        if llmd:
            if section is not None and section.inject_defaults is False:
                return False
            if any(s.plugin_ref == METRICS_SOURCE for s in sources):
                return False
        elif section is not None:
            return False  # GIE: a section given is used as written
        for type_name in (METRICS_SOURCE, CORE_EXTRACTOR):
            if type_name not in self.instances:
                plugin = self.make(type_name)
                if plugin is None:
                    return False
                self.instances[type_name] = plugin
        sources.append(
            DataLayerSource.model_validate(
                {"pluginRef": METRICS_SOURCE, "extractors": [{"pluginRef": CORE_EXTRACTOR}]}
            )
        )
        return True

    def _plugin(self, path: str, ref: str, what: str) -> Plugin | None:
        plugin = self.instances.get(ref)
        if plugin is None:
            self.fail(path, f"{what} {ref!r} is not a plugin of this config", "define it under 'plugins'")
        return plugin

    def _source(
        self, path: str, src: DataLayerSource, bound: set[str]
    ) -> PolledSource | list[EndpointExtractor] | None:
        source = self._plugin(f"{path}.pluginRef", src.plugin_ref, "data source")
        if source is None:
            return None
        described = f"plugin {src.plugin_ref!r} ({source.typed_name.type})"
        bound.add(src.plugin_ref)
        extractors: list[Plugin] = []
        seen_types: set[str] = set()
        for j, ref in enumerate(src.extractors):
            epath = f"{path}.extractors[{j}].pluginRef"
            extractor = self._plugin(epath, ref.plugin_ref, "extractor")
            if extractor is None:
                continue
            bound.add(ref.plugin_ref)
            if extractor.typed_name.type in seen_types:
                self.fail(
                    epath,
                    f"duplicate extractor type {extractor.typed_name.type!r} on source {src.plugin_ref!r}",
                    "list each extractor type once per source",
                )
                continue
            seen_types.add(extractor.typed_name.type)
            extractors.append(extractor)
        if isinstance(source, PollingSource):
            return self._polled(path, src, source, extractors)
        if isinstance(source, EndpointNotificationSource):
            found: list[EndpointExtractor] = []
            for j, extractor in enumerate(extractors):
                if isinstance(extractor, EndpointExtractor):
                    found.append(extractor)
                else:
                    self.fail(
                        f"{path}.extractors[{j}].pluginRef",
                        f"endpoint source {src.plugin_ref!r} requires an endpoint extractor; "
                        f"{extractor.typed_name.name!r} ({extractor.typed_name.type}) is not one",
                        "use an extractor that reads endpoints, such as topology-extractor",
                    )
            return found
        if isinstance(source, ResourceNotificationSource):
            if extractors:
                self.fail(
                    f"{path}.extractors[0].pluginRef",
                    f"no extractor of epick's reads {'/'.join(filter(None, source.gvk))} notifications",
                    "remove the extractors",
                )
            return []
        self.fail(f"{path}.pluginRef", f"{described} is not a data source", "refer to a data source plugin")
        return None

    def _polled(
        self, path: str, src: DataLayerSource, source: PollingSource, extractors: list[Plugin]
    ) -> PolledSource:
        """A polling source and the extractors of its payload (others are reported)."""
        described = f"plugin {src.plugin_ref!r} ({source.typed_name.type})"
        polling: list[PollingExtractor] = []
        for j, extractor in enumerate(extractors):
            epath = f"{path}.extractors[{j}].pluginRef"
            if not isinstance(extractor, PollingExtractor):
                self.fail(
                    epath,
                    f"plugin {extractor.typed_name.name!r} ({extractor.typed_name.type}) is not an "
                    f"extractor that reads a polled payload",
                    f"use an extractor of {source.payload} payloads",
                )
            elif extractor.accepts != source.payload:
                self.fail(
                    epath,
                    f"extractor {extractor.typed_name.name!r} ({extractor.typed_name.type}) reads "
                    f"{extractor.accepts} payloads, but {described} fetches {source.payload}",
                    "pair it with a source of its payload",
                )
            else:
                polling.append(extractor)
        if not src.extractors:
            self.warn(f"{path}: source {src.plugin_ref!r} has no extractors: what it fetches is not read")
        return PolledSource(source, tuple(polling))

    def _discovery(self, where: str, section: DataLayerSection | None) -> EndpointsFileDiscovery | None:
        if section is None or section.discovery is None:
            return None
        discovery = section.discovery
        ref = discovery.endpoints_ref
        if ref is None:
            return None
        path = (
            f"{where}.discovery.endpoints.pluginRef"
            if discovery.endpoints
            else f"{where}.discovery.pluginRef"
        )
        plugin = self._plugin(path, ref, "discovery plugin")
        if plugin is None:
            return None
        if not isinstance(plugin, EndpointsFileDiscovery):
            self.fail(
                path,
                f"plugin {ref!r} ({plugin.typed_name.type}) does not discover endpoints",
                "refer to a file-discovery plugin",
            )
            return None
        return plugin

    def _syncer(self, where: str, section: DataLayerSection | None) -> CrossReplicaSyncer | None:
        """The plugin the cross-replica syncer reference names, which must be a syncer."""
        ref = section.syncer_ref if section is not None else None
        if not ref:
            return None
        assert section is not None
        field = "crossReplica.syncerPluginRef" if section.cross_replica else "crossReplicaSyncerPluginRef"
        path = f"{where}.{field}"
        plugin = self._plugin(path, ref, "cross-replica syncer")
        if plugin is None:
            return None
        if not isinstance(plugin, CrossReplicaSyncer):
            self.fail(
                path,
                f"plugin {ref!r} ({plugin.typed_name.type}) is not a cross-replica syncer",
                "refer to a shared-state-syncer plugin",
            )
            return None
        return plugin

    def _version_fields(self, where: str, section: DataLayerSection) -> None:
        """Fields of the other llm-d apiVersion: v1 groups v1alpha1's crossReplica* under
        crossReplica and has no bare discovery.pluginRef (upstream's types for each refuse the
        other's)."""
        version = self.doc.api_version
        if version == V1:
            for alias, value, instead in (
                ("crossReplicaSyncerPluginRef", section.cross_replica_syncer_plugin_ref, "syncerPluginRef"),
                ("crossReplicaSyncInterval", section.cross_replica_sync_interval, "syncInterval"),
                ("crossReplicaPublishTimeout", section.cross_replica_publish_timeout, "publishTimeout"),
            ):
                if value is not None:
                    self.fail(
                        f"{where}.{alias}",
                        f"unknown field {alias!r} under {V1}",
                        f"write {where}.crossReplica.{instead} (or use {V1ALPHA1})",
                    )
            if section.discovery is not None and section.discovery.plugin_ref is not None:
                self.fail(
                    f"{where}.discovery.pluginRef",
                    f"unknown field 'pluginRef' under {V1}",
                    f"write {where}.discovery.endpoints.pluginRef",
                )
        elif section.cross_replica is not None:
            self.fail(
                f"{where}.crossReplica",
                f"unknown field 'crossReplica' under {version}",
                f"use apiVersion {V1}, or the crossReplica* fields of {V1ALPHA1}",
            )

    def _unsupported(self, where: str, section: DataLayerSection) -> None:
        self._version_fields(where, section)
        if section.discovery is not None and section.discovery.peers is not None:
            self.warn(
                f"{where}.discovery.peers has no effect: no peer discovery type exists, upstream or here"
            )
        if section.peer_discovery is not None:
            self.warn(
                f"{where}.peerDiscovery has no effect: upstream parses it but nothing uses it, nor does epick"
            )
