"""The director: makes each request's `RequestCycle` (cycle.py), and holds what every cycle shares.

`begin` parses the body with the configured parser that claims the request's path
(`requestHandler.parsers`; a path none claims is refused with 404 naming the served ones), applies
the configured model rewrites (InferenceModelRewrite; a client's rewrite header is ignored) and
refuses a model no endpoint serves; `cycle` takes a request already built (the fleet simulator's).
What every cycle shares lives here: the config's request path (path.py), the candidates of the
moment (the datastore's snapshot, or the simulator's), the objectives' priorities, flow control's
admission (admission.py) when the `flowControl` gate is on, endpoint health, the metrics observer.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from epick.config import LoadedConfig
from epick.datalayer.datastore import EndpointSpec
from epick.datalayer.health import EndpointHealth
from epick.datalayer.rewrites import ModelRewrites
from epick.datalayer.traffic import Traffic
from epick.flowcontrol import FlowObserver
from epick.framework import (
    BadRequestError,
    Closeable,
    EndpointRemoved,
    InferenceRequest,
    Parser,
    Snapshot,
    new_request_id,
)
from epick.framework.flowcontrol import TTL_HEADER, fairness_id
from epick.requestcontrol import errors
from epick.requestcontrol.admission import FlowAdmission
from epick.requestcontrol.cycle import RequestCycle
from epick.requestcontrol.path import Observer, RequestPath, safely
from epick.requestcontrol.tokenize import RemoteTokenization
from epick.requestcontrol.tracing import RequestTracing
from epick.requestcontrol.usage import UsageReader

__all__ = ["Director", "Observer", "Parsed", "RequestCycle", "ResponseNeeds"]

log = logging.getLogger(__name__)

OBJECTIVE_HEADER = "x-gateway-inference-objective"
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", OBJECTIVE_HEADER)  # upstream's name, then GIE's
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
PREFILL_HEADER = "x-prefiller-host-port"
ENCODER_HEADER = "x-encoder-hosts-ports"
DATA_PARALLEL_HEADER = "x-data-parallel-host-port"
KV_SOURCE_HEADER = "x-kv-cache-source-host-port"  # p2p-source-producer: the peer to pull KV from
REQUEST_ID_HEADER = "x-request-id"
# The gateway's endpoint subset hint, as a header: only the gateway may narrow the candidates (through
# `envoy.lb.subset_hint` metadata); a client's is dropped, as upstream's system-owned headers are.
SUBSET_HEADER = "x-gateway-destination-endpoint-subset"
DEFAULT_PATH = "/v1/completions"  # a request with no path (upstream's default too)
PATH_HEADER = ":path"  # Envoy's pseudo-header for the request's path (with its query)
CONTROL_HEADERS = frozenset(
    {
        *OBJECTIVE_HEADERS,
        FAIRNESS_HEADER,
        "x-llm-d-inference-fairness-id",
        TTL_HEADER,
        MODEL_REWRITE_HEADER,
        DESTINATION_HEADER,
        SUBSET_HEADER,
        "x-llm-d-pin-host-port",  # endpoint-pin-screener's pin
    }
)
# Headers only epick may set: a client's are dropped before plugins see the request, and before it is
# forwarded (a client must not steer routing, nor point a decode server at a prefill host).
UNTRUSTED_HEADERS = frozenset(
    {
        DESTINATION_HEADER,
        PREFILL_HEADER,
        ENCODER_HEADER,
        DATA_PARALLEL_HEADER,
        KV_SOURCE_HEADER,
        MODEL_REWRITE_HEADER,
    }
)


class ResponseNeeds(enum.IntEnum):
    """How much of each response the service must see, by what the config and the options read."""

    NONE = 0  # nothing: the response goes to the client unread
    HEADERS = 1  # its status and its end: outlier detection, flow control, ResponseReceived hooks
    BODY = 2  # every chunk: ResponseStreaming and ResponseComplete hooks, usage for the metrics


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request as its parser read it, before any decision."""

    request: InferenceRequest
    body: bytes  # what to forward: the client's body, or re-encoded after a model rewrite
    client_model: str  # the model the client asked for, before any rewrite
    parser: Parser
    read_response: bool  # whether the parser reads this request's response (its usage)


class Director:
    def __init__(
        self,
        config: LoadedConfig,
        candidates: Callable[[], Snapshot],
        *,
        max_body_bytes: int = 16 * 1024 * 1024,
        objectives: Mapping[str, int] | None = None,
        known_models: Callable[[], set[str]] | None = None,
        observer: Observer | None = None,
        rewrites: ModelRewrites | None = None,
        health: EndpointHealth | None = None,
        flow_observer: FlowObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`candidates` gives the endpoints to decide on at each moment; `clock` is flow control's
        (the fleet simulator's is virtual)."""
        self.candidates = candidates  # the endpoints of this moment (the datastore's snapshot)
        self.max_body_bytes = max_body_bytes
        self.objectives = dict(objectives or {})
        self.known_models = known_models
        self.observer = observer or Observer()
        self.rewrites = rewrites or ModelRewrites()  # replaced whole on reload
        self.health = health  # told each response's status (outlier detection)
        self.path = RequestPath(config, self.observer)
        self.tokenization = RemoteTokenization()
        self.flow_observer = flow_observer
        self.clock = clock
        # Honour the gateway's endpoint subset hint (`--disable-endpoint-subset-filter` turns it off).
        self.subset_filter = True
        # Report the primary profile's scores in the routing's dynamic metadata (`--emit-endpoint-scores`).
        self.emit_scores = False
        # OpenTelemetry spans for each request (`--tracing`); None: none are made.
        self.tracing: RequestTracing | None = None
        self.admission: FlowAdmission | None = self._admission(config)
        # Called before every scheduling: `epick serve --workers` applies the other workers'
        # updates already received, so a decision sees every decision that reached this process.
        self.before_schedule: Callable[[], None] | None = None
        # Told each endpoint a request goes to as it is dispatched and as it ends (the data layer's
        # quiet scraping reads it); None: not tracked.
        self.traffic: Traffic | None = None

    def set_objectives(self, objectives: Mapping[str, int]) -> None:
        """Objective name -> priority (InferenceObjectives changed); flow control keeps their bands."""
        self.objectives = dict(objectives)
        if self.admission is not None:
            self.admission.set_desired_priorities(sorted(set(self.objectives.values())))

    def _admission(self, config: LoadedConfig) -> FlowAdmission | None:
        if config.flow_control is None:
            return None
        admission = FlowAdmission(
            config.flow_control,
            config.saturation_detector,
            lambda: self.candidates().endpoints,
            observer=self.flow_observer,
            clock=self.clock,
        )
        admission.set_desired_priorities(sorted(set(self.objectives.values())))
        return admission

    @property
    def config(self) -> LoadedConfig:
        return self.path.config

    def endpoint_changed(self, name: str, spec: EndpointSpec | None) -> None:
        """Discovery added, changed (`spec`) or removed (None) an endpoint: plugins that keep
        state per endpoint hear of a removal."""
        if spec is not None:
            return
        for plugin in self.config.plugins.values():
            if isinstance(plugin, EndpointRemoved):
                safely(plugin.endpoint_removed, name)

    def replace_config(self, config: LoadedConfig) -> None:
        """Swap in a new, fully built config (a bad one never gets here: loading raised first). A
        changed flow-control section gets a new controller; the old one dispatches what it holds."""
        self.path.config = config
        old = self.admission
        if old is not None and (
            config.flow_control != old.settings or config.saturation_detector is not old.detector
        ):
            old.drain()
            self.admission = None
        if self.admission is None:
            self.admission = self._admission(config)

    def parse(self, body: bytes, headers: Mapping[str, str], path: str = DEFAULT_PATH) -> Parsed:
        """The request a body and headers make, read by the parser that claims `path`; raises
        `RequestError` (400, 404, 413) naming what is wrong."""
        if len(body) > self.max_body_bytes:
            raise errors.too_large(len(body), self.max_body_bytes)
        path = path.split("?", 1)[0] or DEFAULT_PATH
        parsers = self.config.parsers
        parser = parsers.resolve(path)
        if parser is None:
            raise errors.no_parser(path, parsers.accepted)
        try:
            parsed = parser.parse_request(path, body, headers)
        except BadRequestError as e:
            raise errors.bad_request(str(e)) from None
        except RecursionError:
            raise errors.bad_request("request body is nested too deeply") from None
        raw = parsed.payload
        if raw is not None and (b"\\ud" in body or b"\\uD" in body):  # an escaped surrogate: all paired?
            _check_text(raw)
        lowered = {k.lower(): v for k, v in headers.items()}
        client_model = parsed.model
        model = client_model
        # Rewrites come from configuration (InferenceModelRewrite), never from the client: its
        # x-gateway-model-name-rewrite header is ignored and stripped. A body forwarded unread
        # (payload None) is never rewritten.
        if raw is not None and client_model:
            chosen = self.rewrites.rewrite(client_model)
            if chosen is not None:
                name, target = chosen
                self.observer.rewritten(name, client_model, target)
                if target != client_model:
                    raw["model"] = model = target
                    body = json.dumps(raw).encode()
        objective = next((lowered[h] for h in OBJECTIVE_HEADERS if lowered.get(h)), "")
        # Plugins find the path where upstream's do, in Envoy's `:path` pseudo-header; the proxy's
        # requests carry it too.
        lowered.setdefault(PATH_HEADER, path)
        request = InferenceRequest(
            target_model=model,
            body=parsed.body,
            request_id=lowered.get(REQUEST_ID_HEADER) or new_request_id(),
            headers={k: v for k, v in lowered.items() if k not in UNTRUSTED_HEADERS},
            priority=self.objectives.get(objective, 0),
            objective=objective,
            size=len(body),
        )
        return Parsed(request, body, client_model, parser, not parsed.skip_response)

    def begin(
        self,
        body: bytes,
        headers: Mapping[str, str],
        path: str = DEFAULT_PATH,
        subset: frozenset[str] | None = None,
        arrived: float | None = None,
    ) -> RequestCycle:
        """A request's cycle: parsed, and refused when no endpoint serves its model. Raises
        `RequestError` with the status a client gets. `subset`: the gateway's endpoint subset hint
        (the addresses the request may go to), None for none. `arrived`: when the request's headers
        came, on the director's clock (the request's latencies count from it; None: now)."""
        parsed = self.parse(body, headers, path)
        request, client_model = parsed.request, parsed.client_model
        model = request.target_model
        if self.known_models is not None and model:
            known = self.known_models()
            if known and model not in known:
                labels = (client_model, model, fairness_id(request), str(request.priority))
                self.observer.error(labels, "model_not_found")
                raise errors.unknown_model(model, sorted(known))
        usage = self._usage_reader(parsed.parser, parsed.read_response)
        cycle = RequestCycle(self, request, parsed.body, client_model, usage)
        cycle.subset = subset
        if arrived is not None:
            cycle.started = arrived
        return cycle

    def cycle(self, request: InferenceRequest) -> RequestCycle:
        """The cycle of a request already built (the fleet simulator's): nothing to parse or forward."""
        return RequestCycle(self, request)

    def decide(
        self,
        body: bytes,
        headers: Mapping[str, str],
        path: str = DEFAULT_PATH,
        subset: frozenset[str] | None = None,
        arrived: float | None = None,
    ) -> RequestCycle:
        """`begin` and `RequestCycle.decide`: a request decided without waiting (no flow control, no
        model server's tokens)."""
        cycle = self.begin(body, headers, path, subset, arrived)
        cycle.decide()
        return cycle

    @property
    def response_needs(self) -> ResponseNeeds:
        """What responses must be read for (ext_proc asks the gateway for no more than this)."""
        hooks = self.config.hooks
        if hooks.response_streaming or hooks.response_complete or self.observer.reads_usage:
            return ResponseNeeds.BODY
        health = self.health
        if (
            hooks.response_received
            or self.admission is not None
            or (health and health.policy.counts_statuses)
        ):
            return ResponseNeeds.HEADERS
        return ResponseNeeds.NONE

    def _usage_reader(self, parser: Parser, read_response: bool) -> UsageReader | None:
        """A reader of the response's usage, when the parser can read one and something wants it."""
        if not read_response or self.response_needs < ResponseNeeds.BODY:
            return None
        return UsageReader(parser, self.max_body_bytes)

    @property
    def needs_async(self) -> bool:
        """Whether deciding waits on something (`RequestCycle.admit`): flow control, a model
        server's tokenizer, or a producer's batch."""
        hooks = self.config.hooks
        return self.admission is not None or bool(hooks.remote_tokenizers or hooks.batching)

    async def close(self) -> None:
        """Release what deciding holds open (the tokenizer's HTTP client, the plugins' connections)."""
        await self.tokenization.close()
        await close_plugins(self.config.plugins.values())


async def close_plugins(plugins: Iterable[object]) -> None:
    """Close the plugins that hold something open; one that fails to close is logged, not raised."""
    for plugin in plugins:
        if isinstance(plugin, Closeable):
            try:
                await plugin.aclose()
            except Exception:
                log.exception("closing %s failed", plugin.typed_name)


def _check_text(value: object) -> None:
    """Refuse strings that are not Unicode text: a lone surrogate (JSON lets `"\\ud800"` through)
    cannot be encoded, forwarded or hashed."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise errors.bad_request(
                "request body has a string with a lone surrogate (not Unicode text)"
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k)
            _check_text(v)
    elif isinstance(value, list):
        for v in value:
            _check_text(v)
