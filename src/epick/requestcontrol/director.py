"""The director: everything between a request's bytes and the endpoint it goes to, and its response hooks.

1. parse the body (JSON, completions or chat, `model`, `stream`, `cache_salt`) and apply the
   configured model rewrites (InferenceModelRewrite; a client's rewrite header is ignored);
   2. refuse a model no endpoint serves; 3. the request path
   (path.py) on the datastore's snapshot: admit (a sheddable request, priority < 0 from the objective
   named by `x-gateway-inference-objective`, is refused with 429 when the pool is saturated),
   schedule, run the PreRequest hooks. Front ends then dispatch, and report the response back
   through `response_*`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from epick.config import LoadedConfig
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.health import EndpointHealth
from epick.datalayer.rewrites import ModelRewrites
from epick.framework import (
    BadRequestError,
    Endpoint,
    EndpointRemoved,
    InferenceRequest,
    Response,
    SchedulingResult,
)
from epick.framework.request import RequestKind
from epick.requestcontrol import errors
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.path import Observer, RequestPath, safely

__all__ = ["Decision", "Director", "Observer"]

log = logging.getLogger(__name__)

OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
PREFILL_HEADER = "x-prefiller-host-port"
REQUEST_ID_HEADER = "x-request-id"
CONTROL_HEADERS = frozenset({OBJECTIVE_HEADER, FAIRNESS_HEADER, MODEL_REWRITE_HEADER, DESTINATION_HEADER})
# Headers only epick may set: a client's are dropped before plugins see the request, and before it is
# forwarded (a client must not steer routing, nor point a decode server at a prefill host).
UNTRUSTED_HEADERS = frozenset({DESTINATION_HEADER, PREFILL_HEADER, MODEL_REWRITE_HEADER})


@dataclass(slots=True)
class Decision:
    request: InferenceRequest
    result: SchedulingResult
    body: bytes  # what to forward: the client's body, or re-encoded after a model rewrite
    client_model: str = ""  # the model the client asked for, before any rewrite

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
    ) -> None:
        self.datastore = datastore
        self.max_body_bytes = max_body_bytes
        self.objectives = dict(objectives or {})
        self.known_models = known_models
        self.observer = observer or Observer()
        self.rewrites = rewrites or ModelRewrites()  # replaced whole on reload
        self.health = health  # told each response's status (outlier detection)
        self.path = RequestPath(config, self.observer)
        datastore.subscribe(self._endpoint_changed)

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
        """Swap in a new, fully built config (a bad one never gets here: loading raised first)."""
        self.path.config = config

    def parse(
        self, body: bytes, headers: Mapping[str, str], kind: RequestKind | None
    ) -> tuple[InferenceRequest, bytes, str]:
        """(request, body to forward, the model the client named before any rewrite)."""
        if len(body) > self.max_body_bytes:
            raise errors.too_large(len(body), self.max_body_bytes)
        try:
            raw = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise errors.bad_request(f"request body is not valid JSON: {e}") from None
        except RecursionError:
            raise errors.bad_request("request body is not valid JSON: nested too deeply") from None
        except ValueError as e:  # e.g. a number of more digits than Python converts
            raise errors.bad_request(f"request body cannot be read as JSON: {e}") from None
        if not isinstance(raw, dict):
            raise errors.bad_request("request body must be a JSON object")
        if b"\\ud" in body or b"\\uD" in body:  # an escaped surrogate: is every one paired?
            _check_text(raw)
        lowered = {k.lower(): v for k, v in headers.items()}
        named = raw.get("model")
        client_model = named if isinstance(named, str) else ""
        # Rewrites come from configuration (InferenceModelRewrite), never from the client: its
        # x-gateway-model-name-rewrite header is ignored and stripped.
        target = self.rewrites.target_model(client_model) if client_model else None
        if target is not None and target != client_model:
            raw["model"] = target
            body = json.dumps(raw).encode()
        objective = lowered.get(OBJECTIVE_HEADER, "")
        try:
            request = InferenceRequest.from_openai(
                raw,
                kind=kind,
                request_id=lowered.get(REQUEST_ID_HEADER) or uuid.uuid4().hex,
                headers={k: v for k, v in lowered.items() if k not in UNTRUSTED_HEADERS},
                priority=self.objectives.get(objective, 0),
                size=len(body),
            )
        except BadRequestError as e:
            raise errors.bad_request(str(e)) from None
        return request, body, client_model

    def decide(self, body: bytes, headers: Mapping[str, str], kind: RequestKind | None = None) -> Decision:
        """Parse, admit, schedule and run PreRequest hooks. Raises `RequestError` with its status."""
        request, body, client_model = self.parse(body, headers, kind)
        model = request.target_model
        if self.known_models is not None:
            known = self.known_models()
            if known and model not in known:
                self.observer.error(client_model, model, "model_not_found")
                raise errors.unknown_model(model, sorted(known))
        self.observer.request(client_model, model)
        try:
            result = self.schedule(request)
        except RequestError as e:
            self.observer.error(client_model, model, e.code)
            raise
        return Decision(request, result, body, client_model)

    def schedule(self, request: InferenceRequest, exclude: frozenset[str] = frozenset()) -> SchedulingResult:
        """The request path on the datastore's snapshot, without the endpoints named in `exclude`."""
        snapshot = self.datastore.snapshot()
        if exclude:
            return self.path.decide(request, tuple(ep for ep in snapshot if ep.name not in exclude))
        return self.path.decide(request, snapshot)

    # Response hooks, called by the front end as the response arrives.
    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        if self.health is not None and response.status:
            self.health.answered(endpoint.name, response.status)
        for hook in self.config.hooks.response_received:
            safely(hook.response_received, request, response, endpoint)

    def response_streaming(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        for hook in self.config.hooks.response_streaming:
            safely(hook.response_streaming, request, response, endpoint)

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        for hook in self.config.hooks.response_complete:
            safely(hook.response_complete, request, response, endpoint)


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
