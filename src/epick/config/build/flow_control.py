"""Flow control's settings from `flowControl` (when its feature gate is on), and the saturation
detector (`saturationDetector`, or `flowControl.saturationDetector`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from epick.config.build.plugins import Handle, PluginBuilder
from epick.config.build.sections import flow_control_enabled
from epick.config.defaults import DEFAULT_SATURATION_DETECTOR
from epick.config.issues import _issue_from_pydantic
from epick.config.schema import FlowControlSection, PriorityBandSection
from epick.config.suggest import did_you_mean
from epick.flowcontrol import BandSettings, FlowControlSettings
from epick.flowcontrol.settings import DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS, DEFAULT_REQUEST_TTL
from epick.framework import Endpoint, Plugin, SaturationDetector, TypedName
from epick.framework.flowcontrol import (
    BandSelectionPolicy,
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    UsageLimitPolicy,
)

# Upstream's default policies, resolved by name (llm-d/llm-d-router, pkg/epp/flowcontrol/registry/config.go).
DEFAULT_ORDERING_POLICY = "fcfs-ordering-policy"
DEFAULT_FAIRNESS_POLICY = "global-strict-fairness-policy"
DEFAULT_USAGE_LIMIT_POLICY = "static-usage-limit-policy"
# In-flight eviction's victim filter and order (upstream's cmd/epp/runner/runner.go buildRequestEvictor).
EVICTION_FILTER = "sheddable-eviction-filter"
EVICTION_ORDERING = "priority-then-time-eviction-order-policy"


def build_flow_control(b: PluginBuilder) -> FlowControlSettings | None:
    """The flow-control layer's settings when the `flowControl` gate is on (None: off)."""
    section = b.doc.flow_control
    if not flow_control_enabled(b):
        if section is not None:
            b.warnings.append(
                "section 'flowControl' is ignored but for its saturationDetector: the 'flowControl' "
                "feature gate is off (add it to featureGates to queue requests instead of shedding them)"
            )
        return None
    section = section or FlowControlSection()
    ordering = _ordering(b, DEFAULT_ORDERING_POLICY, "flowControl", default=True)
    fairness = _fairness(b, DEFAULT_FAIRNESS_POLICY, "flowControl", default=True)
    ref = section.usage_limit_policy_plugin_ref
    usage_limit = _usage_limit(
        b, ref or DEFAULT_USAGE_LIMIT_POLICY, "flowControl.usageLimitPolicyPluginRef", default=not ref
    )
    band_selection = _band_selection(b, section.band_selection_policy_plugin_ref)
    if ordering is None or fairness is None:
        return None
    defaults = BandSettings(0, ordering, fairness)

    default_band = defaults
    if section.default_priority_band is not None:
        path = "flowControl.defaultPriorityBand"
        default_band = _band(b, section.default_priority_band, path, 0, defaults) or defaults
    negative = None
    if section.default_negative_priority_band is not None:
        path = "flowControl.defaultNegativePriorityBand"
        negative = _band(b, section.default_negative_priority_band, path, -1, defaults)
    bands = _bands(b, section, defaults)
    if 0 not in bands:  # the fallback band always exists, from the default template
        bands[0] = replace(default_band, priority=0)
    for key, value in (("maxBytes", section.max_bytes), ("maxRequests", section.max_requests)):
        if value is not None and value < 0:
            b.fail(f"flowControl.{key}", f"must be non-negative, got {value}", "use 0 for no global limit")
    eviction_filter, eviction_ordering = _eviction_policies(b) if section.enable_eviction else (None, None)
    if usage_limit is None:
        return None  # reported; the bands were still checked
    ttl = section.default_request_ttl
    no_endpoint_ttl = section.no_endpoint_request_ttl
    if no_endpoint_ttl is None:
        no_endpoint_ttl = ttl  # follows defaultRequestTTL unless split on purpose
    return FlowControlSettings(
        bands=bands,
        default_band=default_band,
        usage_limit=usage_limit,
        default_negative_band=negative,
        max_bytes=max(section.max_bytes or 0, 0),
        max_requests=max(section.max_requests or 0, 0),
        default_request_ttl=DEFAULT_REQUEST_TTL if ttl is None else ttl,
        no_endpoint_request_ttl=DEFAULT_REQUEST_TTL if no_endpoint_ttl is None else no_endpoint_ttl,
        enable_eviction=section.enable_eviction,
        eviction_filter=eviction_filter,
        eviction_ordering=eviction_ordering,
        band_selection=band_selection,
    )


def _band_selection(b: PluginBuilder, ref: str) -> BandSelectionPolicy | None:
    """The policy `bandSelectionPolicyPluginRef` names (None: highest priority first)."""
    if not ref:
        return None
    path = "flowControl.bandSelectionPolicyPluginRef"
    plugin = b.instances.get(ref)
    if plugin is None:
        b.fail(
            path, f"{ref!r} is not a plugin of this config", "define a strict-band-selection-policy plugin"
        )
        return None
    if not isinstance(plugin, BandSelectionPolicy):
        b.fail(path, f"plugin {ref!r} ({plugin.typed_name.type}) is not a band-selection policy")
        return None
    return plugin


def _bands(b: PluginBuilder, section: FlowControlSection, defaults: BandSettings) -> dict[int, BandSettings]:
    """`priorityBands`, by priority (a priority given twice is an error)."""
    bands: dict[int, BandSettings] = {}
    for i, entry in enumerate(section.priority_bands):
        path = f"flowControl.priorityBands[{i}]"
        if entry.priority in bands:
            b.fail(
                f"{path}.priority",
                f"duplicate priority level {entry.priority}",
                "configure each priority once",
            )
            continue
        built = _band(b, entry, path, entry.priority, defaults)
        if built is not None:
            bands[entry.priority] = built
    return bands


def _band(
    b: PluginBuilder, entry: PriorityBandSection, path: str, priority: int, defaults: BandSettings
) -> BandSettings | None:
    """One band: its policies (the flow-control defaults unless it names its own), limits and TTL."""
    b_ordering: OrderingPolicy | None = defaults.ordering
    b_fairness: FairnessPolicy | None = defaults.fairness
    if entry.ordering_policy_ref:
        b_ordering = _ordering(b, entry.ordering_policy_ref, f"{path}.orderingPolicyRef")
    if entry.fairness_policy_ref:
        b_fairness = _fairness(b, entry.fairness_policy_ref, f"{path}.fairnessPolicyRef")
    limits = {}
    for key, value in (("maxBytes", entry.max_bytes), ("maxRequests", entry.max_requests)):
        if value is not None and value < 0:
            b.fail(f"{path}.{key}", f"must be non-negative, got {value}", "use 0 for the default")
        limits[key] = max(value or 0, 0)
    if b_ordering is None or b_fairness is None:
        return None
    return BandSettings(
        priority,
        b_ordering,
        b_fairness,
        max_bytes=limits["maxBytes"] or DEFAULT_BAND_MAX_BYTES,
        max_requests=limits["maxRequests"] or DEFAULT_BAND_MAX_REQUESTS,
        default_request_ttl=entry.default_request_ttl,  # None: the global defaultRequestTTL
    )


def _eviction_policies(b: PluginBuilder) -> tuple[EvictionFilterPolicy | None, EvictionOrderingPolicy | None]:
    """In-flight eviction's victim filter and order: upstream wires these two, whatever the
    config defines."""
    found_filter = b.default_instance(EVICTION_FILTER)
    found_ordering = b.default_instance(EVICTION_ORDERING)
    if isinstance(found_filter, EvictionFilterPolicy) and isinstance(found_ordering, EvictionOrderingPolicy):
        return found_filter, found_ordering
    b.fail(
        "flowControl.enableEviction",
        f"in-flight eviction needs the {EVICTION_FILTER} and {EVICTION_ORDERING} plugin types, "
        "which this registry lacks",
    )
    return None, None


def _flow_ref(b: PluginBuilder, ref: str, path: str, default: bool) -> Plugin | None:
    """The plugin `ref` names; a default reference (upstream's default policies, by type name)
    the config does not define is made with default parameters."""
    found = b.instances.get(ref)
    if found is None and default and ref not in b.entries:
        found = b.default_instance(ref)
    if found is None and ref not in b.entries:  # (one that failed to build has its own error)
        close = did_you_mean(ref, b.entries)
        b.fail(
            path,
            f"refers to undefined plugin {ref!r}",
            f"did you mean '{close}'?" if close else f"define a plugin named {ref!r} under 'plugins'",
        )
    return found


def _wrong_kind(b: PluginBuilder, path: str, ref: str, plugin: Plugin, kind: str) -> None:
    b.fail(
        path,
        f"plugin {ref!r} ({plugin.typed_name.type}) is not a flow-control {kind}",
        f"refer to a {kind} plugin",
    )


def _ordering(b: PluginBuilder, ref: str, path: str, *, default: bool = False) -> OrderingPolicy | None:
    found = _flow_ref(b, ref, path, default)
    if found is None or isinstance(found, OrderingPolicy):
        return found
    _wrong_kind(b, path, ref, found, "ordering policy")
    return None


def _fairness(b: PluginBuilder, ref: str, path: str, *, default: bool = False) -> FairnessPolicy | None:
    found = _flow_ref(b, ref, path, default)
    if found is None or isinstance(found, FairnessPolicy):
        return found
    _wrong_kind(b, path, ref, found, "fairness policy")
    return None


def _usage_limit(b: PluginBuilder, ref: str, path: str, *, default: bool = False) -> UsageLimitPolicy | None:
    found = _flow_ref(b, ref, path, default)
    if found is None or isinstance(found, UsageLimitPolicy):
        return found
    _wrong_kind(b, path, ref, found, "usage-limit policy")
    return None


def saturation_detector(b: PluginBuilder) -> SaturationDetector:
    """The detector `saturationDetector` names (`pluginRef`) or configures (thresholds: a
    utilization-detector with them), else the config's utilization-detector, else a default one."""
    section = b.doc.saturation_detector
    path = "saturationDetector"
    if b.doc.flow_control is not None and b.doc.flow_control.saturation_detector is not None:
        if section is not None:
            b.warnings.append(
                "'saturationDetector' is deprecated upstream and overridden by "
                "'flowControl.saturationDetector', which is used"
            )
        section = b.doc.flow_control.saturation_detector
        path = "flowControl.saturationDetector"
    if section is not None and section.plugin_ref is not None:
        if section.queue_depth_threshold is not None or section.kv_cache_util_threshold is not None:
            b.fail(
                path,
                "give either 'pluginRef' or thresholds, not both",
                "move the thresholds into the referenced plugin's parameters",
            )
        found = b.instances.get(section.plugin_ref)
        if isinstance(found, SaturationDetector):
            return found
        b.fail(
            f"{path}.pluginRef",
            f"{section.plugin_ref!r} is not a saturation detector plugin of this config",
            "define a utilization-detector or concurrency-detector plugin and refer to its name",
        )
        return _utilization_detector(b, {}, path)
    if section is not None:
        values: dict[str, Any] = {
            "queueDepthThreshold": section.queue_depth_threshold,
            "kvCacheUtilThreshold": section.kv_cache_util_threshold,
            "metricsStalenessThreshold": section.metrics_staleness_threshold,
        }
        return _utilization_detector(b, {k: v for k, v in values.items() if v is not None}, path)
    configured = (
        p
        for p in b.instances.values()
        if isinstance(p, SaturationDetector) and p.typed_name.type == DEFAULT_SATURATION_DETECTOR
    )
    return next(configured, None) or _utilization_detector(b, {}, path)


def _utilization_detector(b: PluginBuilder, given: dict[str, Any], path: str) -> SaturationDetector:
    """A utilization-detector named `saturation-detector`, built from its spec with `given`
    parameters (a problem with them is reported at `path`)."""
    spec = b.registry.get(DEFAULT_SATURATION_DETECTOR)
    if spec is None:
        b.fail(path, f"the saturation detector needs the {DEFAULT_SATURATION_DETECTOR} plugin type")
        return _NoDetector()
    try:
        params = spec.parameters.model_validate(b.parameters_of(spec.type, given))
    except ValidationError as e:
        b.issues.extend(_issue_from_pydantic(err, spec.parameters, prefix=path) for err in e.errors())
        params = spec.parameters()
    plugin = spec.factory("saturation-detector", params, Handle(b, "saturation-detector"))
    assert isinstance(plugin, SaturationDetector)
    return plugin


class _NoDetector:
    """Stands in while a config fails to load (the registry has no detector type): never used."""

    typed_name = TypedName("saturation-detector", "none")

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return 0.0
