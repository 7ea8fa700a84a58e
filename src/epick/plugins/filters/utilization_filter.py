"""`utilization-filter`: drop the endpoints over any of the configured utilization caps.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/utilization/filter.go):
`conditions` (at least one) is a list of `{metric, maxValue}`; an endpoint is kept only when, for every
condition, its metric's value is <= `maxValue`. The metrics: `active-requests` (the requests this EPP
has in flight on it, from the `inflight-load-producer` that `inFlightLoadProducerName` names, else the
config's, added with default parameters when the config has none), `running-requests` and
`waiting-queue` (the model server's running and waiting counts), `kv-cache-utilization` (its KV-cache
use, a fraction: `maxValue` must be <= 1). A value the endpoint does not have reads as 0. `maxValue` is
required and must be >= 0. When no endpoint is left and `fallbackOnEmpty` (false) is set, all pass;
otherwise none does, and the profile fails.

Unlike `utilization-detector` (filters/utilization.py), which shares only the scraped fields it reads:
caps are inclusive (`<=`, the detector keeps `<` its thresholds), metrics have no staleness, and the
filter fails open only with `fallbackOnEmpty`. Deviations, on purpose: `inFlightLoadProducerName` is
resolved (and a missing producer refused at load) only when a condition reads `active-requests`, the
only time upstream reads it; `maxValue` must be finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.load.inflight import TYPE as INFLIGHT_TYPE
from epick.plugins.load.inflight import InFlightLoadProducer, resolve_inflight
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "utilization-filter"
ACTIVE_REQUESTS = "active-requests"
RUNNING_REQUESTS = "running-requests"
WAITING_QUEUE = "waiting-queue"
KV_CACHE_UTILIZATION = "kv-cache-utilization"
METRICS = (ACTIVE_REQUESTS, RUNNING_REQUESTS, WAITING_QUEUE, KV_CACHE_UTILIZATION)


class Condition(Parameters):
    metric: str = ""
    max_value: float | None = None


class UtilizationFilterParameters(Parameters):
    conditions: tuple[Condition, ...] = ()
    fallback_on_empty: bool = False
    in_flight_load_producer_name: str = ""

    def reads_active_requests(self) -> bool:
        return any(c.metric == ACTIVE_REQUESTS for c in self.conditions)


def check(params: UtilizationFilterParameters) -> list[tuple[str, float]]:
    """The conditions as (metric, cap), or a ParameterError naming the first one at fault."""
    if not params.conditions:
        raise ParameterError(
            "conditions",
            "utilization filter requires at least one condition",
            f"add a condition, e.g. {{metric: {RUNNING_REQUESTS}, maxValue: 40}}",
        )
    out = []
    for i, c in enumerate(params.conditions):
        where = f"conditions[{i}]"
        if c.metric not in METRICS:
            raise ParameterError(
                f"{where}.metric",
                "utilization filter condition metric must be one of "
                + ", ".join(f'"{m}"' for m in METRICS)
                + f', got "{c.metric}"',
                "use one of " + ", ".join(METRICS),
            )
        if c.max_value is None:
            raise ParameterError(
                f"{where}.maxValue",
                f'utilization filter condition for "{c.metric}" requires maxValue',
                "add maxValue: the largest value an endpoint may have and still pass",
            )
        if not math.isfinite(c.max_value) or c.max_value < 0:
            raise ParameterError(
                f"{where}.maxValue",
                f'utilization filter condition for "{c.metric}" requires a non-negative maxValue, '
                f"got {c.max_value:g}",
                "use a finite number >= 0",
            )
        if c.metric == KV_CACHE_UTILIZATION and c.max_value > 1:
            raise ParameterError(
                f"{where}.maxValue",
                f'utilization filter maxValue for "{KV_CACHE_UTILIZATION}" is a fraction and must be '
                f"at most 1, got {c.max_value:g}",
                "use a fraction in [0, 1], e.g. 0.8 for 80%",
            )
        out.append((c.metric, c.max_value))
    return out


class UtilizationFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS | Reads.HISTORY  # scraped metrics, and the in-flight counts

    def __init__(
        self,
        name: str | None,
        params: UtilizationFilterParameters,
        inflight: InFlightLoadProducer | None = None,
    ) -> None:
        super().__init__(name)
        self.params = params
        self.conditions = check(self.params)
        self.inflight = inflight
        self._value: dict[str, Callable[[Endpoint], float]] = {
            ACTIVE_REQUESTS: self._active_requests,
            RUNNING_REQUESTS: lambda ep: ep.metrics.running_requests_size,
            WAITING_QUEUE: lambda ep: ep.metrics.waiting_queue_size,
            KV_CACHE_UTILIZATION: lambda ep: ep.metrics.kv_cache_usage_percent,
        }

    def _active_requests(self, endpoint: Endpoint) -> float:
        return self.inflight.load(endpoint.name).requests if self.inflight is not None else 0

    def passes(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint is within every cap."""
        return all(self._value[metric](endpoint) <= cap for metric, cap in self.conditions)

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        kept = [ep for ep in endpoints if self.passes(ep)]
        if not kept and self.params.fallback_on_empty:
            return endpoints
        return kept


def _factory(name: str, params: UtilizationFilterParameters, handle: Handle) -> UtilizationFilter:
    check(params)  # before resolving the producer: a bad condition is the first thing to report
    inflight = None
    if params.reads_active_requests():
        inflight = resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName")
    return UtilizationFilter(name, params, inflight)


def _requires(params: UtilizationFilterParameters, api_version: str = "") -> tuple[str, ...]:
    if params.reads_active_requests() and not params.in_flight_load_producer_name:
        return (INFLIGHT_TYPE,)
    return ()


SPEC = PluginSpec(
    TYPE,
    _factory,
    UtilizationFilterParameters,
    "only endpoints within every utilization cap",
    requires=_requires,
    worker_state="",
)
