"""One small protocol per extension point. A plugin implements whichever it needs.

Contracts the runtime relies on (and enforces where it cheaply can):
- Filters return a subset of the endpoints they were given, in any order; an empty list means
  "none fits" and ends the profile with an error naming the filter.
- Scorers return one score per endpoint, in the order given. Higher is better. The runtime clamps
  each score to [0, 1] (NaN counts as 0) and applies the profile's weight; scorers never weight.
- Pickers receive every surviving endpoint with its weighted total and return a non-empty result
  whose targets are drawn from them, primary first.
- A profile handler's `pick_profiles` is called again and again until it returns no profile; the profiles it
  returns run sequentially in the order returned, and later calls see their results.
- `EndpointRemoved` is called when an endpoint leaves the pool, so a plugin that keeps state per
  endpoint (a prefix index, an LRU) forgets it.
- Request-control hooks run outside the scheduling call, after it, in the service's order:
  `PreRequest` once the decision is made, then `ResponseReceived` (headers), `ResponseStreaming`
  (each chunk) and `ResponseComplete` (end, success or failure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from epick.framework.cycle_state import CycleState
from epick.framework.endpoint import Endpoint
from epick.framework.plugin import Plugin
from epick.framework.request import InferenceRequest
from epick.framework.response import Response
from epick.framework.results import ProfileRunResult, SchedulingResult, ScoredEndpoint

# Names of extension points, as used in metrics and traces.
FILTER = "Filter"
SCORER = "Scorer"
PICKER = "Picker"
PROFILE_HANDLER = "ProfileHandler"
DATA_PRODUCER = "DataProducer"
ADMITTER = "Admitter"


@runtime_checkable
class Filter(Plugin, Protocol):
    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class Scorer(Plugin, Protocol):
    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]: ...


@runtime_checkable
class Picker(Plugin, Protocol):
    def pick(
        self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> ProfileRunResult: ...


class ProfileLike(Protocol):
    """What a profile handler needs to know of a profile (see `SchedulerProfile`)."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class ProfileHandler(Plugin, Protocol):
    def pick_profiles(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        profiles: Mapping[str, ProfileLike],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        """Names of the profiles to run next, in order; empty when scheduling is done."""
        ...

    def process_results(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        """Merge the profile results into the final result; raise `SchedulingError` if impossible."""
        ...


@runtime_checkable
class NeedsProfiles(Protocol):
    """A plugin that refers to profiles by name (a profile handler's prefill and decode profiles):
    the config loader checks that each exists."""

    def required_profiles(self) -> dict[str, str]:
        """Profile names this plugin refers to, keyed by the parameter that names them."""
        ...


@runtime_checkable
class PrefillProfileBound(Protocol):
    """A plugin bound to the profile whose target prefills: the profile handler that runs it, and a
    hook that acts on its target (the prefill-header-handler). A config's must all name one."""

    def bound_prefill_profile(self) -> str:
        """The name of the profile that prefills, as this plugin knows it."""
        ...


@runtime_checkable
class DataProducer(Plugin, Protocol):
    """Computes per-request data before scheduling (upstream's `DataProducer.Produce`): writes it to
    the cycle state under its data key "<dataType>/<its name>", where consumers configured with its
    name read it. Producers run in the order they were built (a producer another one reads, first);
    one that raises ends the phase
    for that request (later producers do not run) and the request is scheduled without their data."""

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None: ...


@runtime_checkable
class BatchingProducer(Plugin, Protocol):
    """A data producer that must see the requests arriving with this one before it can produce
    (upstream's burst batching): the front end awaits `collect` before the request is scheduled, on
    its event loop, and the producer's `produce` then writes what the batch decided. A `collect` that
    raises makes that `produce` raise (the later producers are skipped, as upstream's rule for a
    failing producer); a request whose `collect` never ran (a retry, a synchronous caller) is
    produced as if it had arrived alone."""

    async def collect(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None: ...


@runtime_checkable
class Closeable(Plugin, Protocol):
    """A plugin that holds something open (a connection to a shared store): the service closes it
    when it stops, or when a reloaded config no longer has it."""

    async def aclose(self) -> None: ...


@runtime_checkable
class ReadinessChecker(Plugin, Protocol):
    """A plugin whose asynchronous start must finish before the service takes traffic (upstream's
    `ReadinessChecker`, llm-d/llm-d-router pkg/epp/framework/interface/plugin/plugins.go): while
    `check_ready` names a reason, the readiness probe answers NOT_SERVING and says why. It is asked on
    every probe, so it reports state the plugin keeps and does no I/O."""

    def check_ready(self) -> str | None:
        """None when ready; else why not, in words."""
        ...


@runtime_checkable
class StateDumper(Plugin, Protocol):
    """A plugin whose runtime state `/debug/plugins/state` shows (upstream's `StateDumper`): small and
    bounded (long lists capped, with their full length beside), JSON-able, and free of request
    payloads and credentials."""

    def dump_state(self) -> object:
        """The state, as JSON-able values (dicts, lists, strings, numbers, booleans, None)."""
        ...


@runtime_checkable
class RequestHeaderProcessor(Plugin, Protocol):
    """Reads a request's headers first, before admission (upstream's `RequestHeaderProcessor`), and
    publishes what it finds in the cycle state for the plugins after it."""

    def process_request_headers(self, request: InferenceRequest, cycle_state: CycleState) -> None: ...


@runtime_checkable
class Screener(Plugin, Protocol):
    """Narrows a request's candidates before the data producers and every profile (upstream's
    `requestcontrol.Screener`): each screener sees the same candidates, the request keeps those every
    screener kept (in their order), and none kept fails it (503)."""

    def screen(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class Admitter(Plugin, Protocol):
    """Decides, after the data producers and before scheduling, whether to serve the request at all
    (upstream's `requestcontrol.Admitter`): None admits it, a reason refuses it (the client gets 429)."""

    def admit(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> str | None: ...


@runtime_checkable
class SaturationDetector(Plugin, Protocol):
    """How saturated a pool is (>= 1: saturated), for admission: a sheddable request meeting a
    saturated pool is refused."""

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float: ...


@runtime_checkable
class StagedSaturationDetector(SaturationDetector, Protocol):
    """A saturation detector that answers differently per stage: flow control asks it for the
    prefill endpoints ("prefill"), the decode endpoints ("decode"; an endpoint without a role is
    one), or the whole pool ("") when none is either (upstream's `SaturationStageFromContext`)."""

    def stage_saturation(self, stage: str, endpoints: Sequence[Endpoint]) -> float: ...


class PluginTimer(Protocol):
    """Receives how long each plugin call took (the service turns it into a metric)."""

    def observe(self, extension_point: str, plugin: Plugin, seconds: float) -> None: ...


@runtime_checkable
class PreRequest(Plugin, Protocol):
    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        """After the decision, before dispatch; `cycle_state` is the scheduling call's own."""
        ...


@runtime_checkable
class ResponseReceived(Plugin, Protocol):
    def response_received(
        self, request: InferenceRequest, response: Response, endpoint: Endpoint
    ) -> None: ...


@runtime_checkable
class ResponseStreaming(Plugin, Protocol):
    def response_streaming(
        self, request: InferenceRequest, response: Response, endpoint: Endpoint
    ) -> None: ...


@runtime_checkable
class ResponseComplete(Plugin, Protocol):
    def response_complete(
        self, request: InferenceRequest, response: Response, endpoint: Endpoint
    ) -> None: ...


@runtime_checkable
class EndpointRemoved(Plugin, Protocol):
    def endpoint_removed(self, name: str) -> None:
        """The endpoint called `name` has left the pool (discovery removed it)."""
        ...
