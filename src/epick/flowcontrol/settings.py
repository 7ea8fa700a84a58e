"""Flow control's resolved configuration: priority bands with their policies and limits, the global
limits and the queue-wait budgets. The config loader builds it from a `flowControl` section, with
upstream's defaults (llm-d/llm-d-router, pkg/epp/flowcontrol/registry/config.go and
controller/config.go)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from epick.framework.flowcontrol import (
    BandSelectionPolicy,
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    UsageLimitPolicy,
)

DEFAULT_BAND_MAX_BYTES = 1_000_000_000  # 1 GB per band
DEFAULT_BAND_MAX_REQUESTS = 5000
DEFAULT_REQUEST_TTL = 60.0  # seconds
DEFAULT_FLOW_GC_TIMEOUT = 300.0
DEFAULT_BAND_GC_TIMEOUT = 600.0
DEFAULT_DISPATCH_INTERVAL = 0.001  # upstream's dispatch ticker


@dataclass(frozen=True, slots=True)
class BandSettings:
    """One priority band: its policies and its limits (a limit of 0 is never stored: it means the
    default)."""

    priority: int
    ordering: OrderingPolicy
    fairness: FairnessPolicy
    max_bytes: int = DEFAULT_BAND_MAX_BYTES
    max_requests: int = DEFAULT_BAND_MAX_REQUESTS
    # The band's own queue-wait bound (seconds; 0: unbounded), replacing the global defaultRequestTTL;
    # None: the global one (llm-d/llm-d-router #2649).
    default_request_ttl: float | None = None


@dataclass(frozen=True, slots=True)
class FlowControlSettings:
    bands: Mapping[int, BandSettings]  # configured bands, priority 0 always among them
    default_band: BandSettings  # template for a priority no band configures
    usage_limit: UsageLimitPolicy
    default_negative_band: BandSettings | None = None  # template for priorities < 0
    max_bytes: int = 0  # global limits; 0: none
    max_requests: int = 0
    # Queue-wait budgets (seconds; 0 disables expiry in that regime): while the pool has endpoints,
    # and while it has none (then the queue is a scale-from-zero waiting room).
    default_request_ttl: float = DEFAULT_REQUEST_TTL
    no_endpoint_request_ttl: float = DEFAULT_REQUEST_TTL
    flow_gc_timeout: float = DEFAULT_FLOW_GC_TIMEOUT
    band_gc_timeout: float = DEFAULT_BAND_GC_TIMEOUT
    dispatch_interval: float = DEFAULT_DISPATCH_INTERVAL
    enable_eviction: bool = False
    eviction_filter: EvictionFilterPolicy | None = None
    eviction_ordering: EvictionOrderingPolicy | None = None
    # The order the cycle visits the bands in (`bandSelectionPolicyPluginRef`); None: highest first.
    band_selection: BandSelectionPolicy | None = None
    # Priorities to keep provisioned besides the configured ones (the objectives' priorities).
    desired_priorities: frozenset[int] = field(default_factory=frozenset)

    def template_for(self, priority: int) -> BandSettings:
        """The settings a band of `priority` gets: its own, else the (negative) default template."""
        band = self.bands.get(priority)
        if band is not None:
            return band
        template = self.default_band
        if priority < 0 and self.default_negative_band is not None:
            template = self.default_negative_band
        return replace(template, priority=priority)
