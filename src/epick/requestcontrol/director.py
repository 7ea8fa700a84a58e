"""The director: everything between a request's bytes and the endpoint it goes to, and its response hooks.

1. parse the body with the configured parser that claims the request's path (`requestHandler.parsers`;
   a path none claims is refused with 404 naming the served ones) and apply the configured model
   rewrites (InferenceModelRewrite; a client's rewrite header is ignored);
   2. refuse a model no endpoint serves; 3. the request path
   (path.py) on the datastore's snapshot: admit (a sheddable request, priority < 0 from the objective
   named by `x-gateway-inference-objective`, is refused with 429 when the pool is saturated; with the
   `flowControl` gate on, every request waits in flow control instead, `decide_async`),
   schedule, run the PreRequest hooks. Front ends then dispatch, and report the response back
   through `response_*`, where the parser reads the response's token usage.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from epick.config import LoadedConfig
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.health import EndpointHealth
from epick.datalayer.rewrites import ModelRewrites
from epick.flowcontrol import FlowObserver
from epick.framework import (
    BadRequestError,
    Endpoint,
    EndpointRemoved,
    InferenceRequest,
    Parser,
    Response,
    SchedulingResult,
    new_request_id,
)
from epick.requestcontrol import errors
from epick.requestcontrol.admission import EvictionSignal, FlowAdmission
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.path import Observer, RequestPath, safely
from epick.requestcontrol.tokenize import RemoteTokenization
from epick.requestcontrol.usage import UsageReader

__all__ = ["Decision", "Director", "Observer", "ResponseNeeds"]

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
DEFAULT_PATH = "/v1/completions"  # a request with no path (upstream's default too)
CONTROL_HEADERS = frozenset(
    {
        *OBJECTIVE_HEADERS,
        FAIRNESS_HEADER,
        "x-llm-d-inference-fairness-id",
        MODEL_REWRITE_HEADER,
        DESTINATION_HEADER,
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


@dataclass(slots=True)
class Decision:
    request: InferenceRequest
    result: SchedulingResult
    body: bytes  # what to forward: the client's body, or re-encoded after a model rewrite
    client_model: str = ""  # the model the client asked for, before any rewrite
    # Reads the response's usage with the request's parser (None: the response is not read).
    usage: UsageReader | None = field(default=None, repr=False)
    # Whether the response was reported complete; shared by the copies a retry makes (`replace`).
    completed: list[bool] = field(default_factory=lambda: [False], repr=False)
    # Flow control may evict it while in flight (enableEviction): how the front end hears of it.
    eviction: EvictionSignal | None = field(default=None, repr=False)

    @property
    def targets(self) -> tuple[Endpoint, ...]:
        return self.result.targets

    @property
    def prefill(self) -> Endpoint | None:
        """The prefill endpoint when the decision disaggregates (the prefill profile ran)."""
        return self.result.prefill


class Director:
    def __init__(
        self,
        config: LoadedConfig,
        datastore: Datastore,
        *,
        max_body_bytes: int = 16 * 1024 * 1024,
        objectives: Mapping[str, int] | None = None,
        known_models: Callable[[], set[str]] | None = None,
        observer: Observer | None = None,
        rewrites: ModelRewrites | None = None,
        health: EndpointHealth | None = None,
        flow_observer: FlowObserver | None = None,
    ) -> None:
        self.datastore = datastore
        self.max_body_bytes = max_body_bytes
        self.objectives = dict(objectives or {})
        self.known_models = known_models
        self.observer = observer or Observer()
        self.rewrites = rewrites or ModelRewrites()  # replaced whole on reload
        self.health = health  # told each response's status (outlier detection)
        self.path = RequestPath(config, self.observer)
        self.tokenization = RemoteTokenization()
        self.flow_observer = flow_observer
        self.admission: FlowAdmission | None = self._admission(config)
        # Called before every scheduling: `epick serve --workers` applies the other workers'
        # updates already received, so a decision sees every decision that reached this process.
        self.before_schedule: Callable[[], None] | None = None
        datastore.subscribe(self._endpoint_changed)

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
            lambda: self.datastore.snapshot().endpoints,
            observer=self.flow_observer,
        )
        admission.set_desired_priorities(sorted(set(self.objectives.values())))
        return admission

    @property
    def config(self) -> LoadedConfig:
        return self.path.config

    def _endpoint_changed(self, name: str, spec: EndpointSpec | None) -> None:
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

    def parse(
        self, body: bytes, headers: Mapping[str, str], path: str = DEFAULT_PATH
    ) -> tuple[InferenceRequest, bytes, str, Parser, bool]:
        """(request, body to forward, the model the client named before any rewrite, the parser that
        read it, whether its response is to be read)."""
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
            target = self.rewrites.target_model(client_model)
            if target is not None and target != client_model:
                raw["model"] = model = target
                body = json.dumps(raw).encode()
        objective = next((lowered[h] for h in OBJECTIVE_HEADERS if lowered.get(h)), "")
        request = InferenceRequest(
            target_model=model,
            body=parsed.body,
            request_id=lowered.get(REQUEST_ID_HEADER) or new_request_id(),
            headers={k: v for k, v in lowered.items() if k not in UNTRUSTED_HEADERS},
            priority=self.objectives.get(objective, 0),
            objective=objective,
            size=len(body),
        )
        return request, body, client_model, parser, not parsed.skip_response

    def decide(self, body: bytes, headers: Mapping[str, str], path: str = DEFAULT_PATH) -> Decision:
        """Parse, admit, schedule and run PreRequest hooks. Raises `RequestError` with its status.
        Flow control is not consulted, nor a model server asked for tokens: front ends call
        `decide_async` when `needs_async`."""
        request, body, client_model, parser, read_response = self._begin(body, headers, path)
        return self._scheduled(request, body, client_model, parser, read_response)

    def _scheduled(
        self, request: InferenceRequest, body: bytes, client_model: str, parser: Parser, read_response: bool
    ) -> Decision:
        try:
            result = self.schedule(request)
        except RequestError as e:
            self.observer.error(client_model, request.target_model, e.code)
            raise
        return Decision(request, result, body, client_model, self._usage_reader(parser, read_response))

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
        """Whether deciding waits on something: flow control, a model server's tokenizer, or a
        producer's batch."""
        hooks = self.config.hooks
        return self.admission is not None or bool(hooks.remote_tokenizers or hooks.batching)

    async def decide_async(
        self, body: bytes, headers: Mapping[str, str], path: str = DEFAULT_PATH
    ) -> Decision:
        """`decide`, with the token ids a model server gives (when a token producer asks one), after
        the batching producers have seen the request's batch (before flow control), and waiting in
        flow control when it is on (until the request is dispatched, refused, expires,
        or the caller is cancelled: then it leaves its queue at once)."""
        admission = self.admission
        hooks = self.config.hooks
        remote, batching = hooks.remote_tokenizers, hooks.batching
        if admission is None and not remote and not batching:
            return self.decide(body, headers, path)
        request, body, client_model, parser, read_response = self._begin(body, headers, path)
        if remote:
            await self.tokenization.tokenize(request, remote)
        if batching:
            await self.path.collect(request, batching, self.datastore.snapshot())
        if admission is None:
            return self._scheduled(request, body, client_model, parser, read_response)
        cycle_state, fairness = self.path.prepare(request)
        usage = self._usage_reader(parser, read_response)

        def dispatched() -> Decision:
            result = self.path.decide_admitted(request, cycle_state, self.datastore.snapshot())
            decision = Decision(request, result, body, client_model, usage)
            if result.targets:
                decision.eviction = admission.evictable(request, result.targets[0])
            return decision

        try:
            return await admission.admit(request, fairness, dispatched, on_abandoned=self.abandon)
        except RequestError as e:
            self.observer.error(client_model, request.target_model, e.code)
            raise

    async def close(self) -> None:
        """Release what deciding holds open (the tokenizer's HTTP client)."""
        await self.tokenization.close()

    def _begin(
        self, body: bytes, headers: Mapping[str, str], path: str
    ) -> tuple[InferenceRequest, bytes, str, Parser, bool]:
        """Parse, and refuse a model no endpoint serves."""
        request, body, client_model, parser, read_response = self.parse(body, headers, path)
        model = request.target_model
        if self.known_models is not None and model:
            known = self.known_models()
            if known and model not in known:
                self.observer.error(client_model, model, "model_not_found")
                raise errors.unknown_model(model, sorted(known))
        self.observer.request(client_model, model)
        return request, body, client_model, parser, read_response

    def abandon(self, d: Decision) -> None:
        """A decision that will never be dispatched (its client left): release what it holds."""
        if not d.completed[0] and d.targets:
            failed = Response(d.request.request_id, status=0, error="client left before dispatch")
            self.response_complete(d, failed, d.targets[0])

    def schedule(self, request: InferenceRequest, exclude: frozenset[str] = frozenset()) -> SchedulingResult:
        """The request path on the datastore's snapshot, without the endpoints named in `exclude`."""
        if self.before_schedule is not None:
            self.before_schedule()
        snapshot = self.datastore.snapshot()
        if exclude:
            return self.path.decide(request, tuple(ep for ep in snapshot if ep.name not in exclude))
        return self.path.decide(request, snapshot)

    # Response hooks, called by the front end as the response arrives.
    def response_received(self, d: Decision, response: Response, endpoint: Endpoint) -> None:
        if self.health is not None and response.status:
            self.health.answered(endpoint.name, response.status)
        if d.usage is not None:
            d.usage.start(response)
        for hook in self.config.hooks.response_received:
            safely(hook.response_received, d.request, response, endpoint)

    def response_streaming(self, d: Decision, response: Response, endpoint: Endpoint) -> None:
        if d.usage is not None:
            d.usage.feed(response)
        for hook in self.config.hooks.response_streaming:
            safely(hook.response_streaming, d.request, response, endpoint)

    def response_complete(self, d: Decision, response: Response, endpoint: Endpoint) -> None:
        """Once per decision (a second report is ignored): the hooks release what the request held."""
        if d.completed[0]:
            return
        d.completed[0] = True
        if d.usage is not None:
            d.usage.finish(response)
            if response.usage is not None:
                self.observer.usage(d.client_model, d.request.target_model, response.usage)
        for hook in self.config.hooks.response_complete:
            safely(hook.response_complete, d.request, response, endpoint)
        if d.eviction is not None:
            d.eviction.release()
        if self.admission is not None:
            self.admission.notify()  # capacity freed: a waiting request may go now


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
