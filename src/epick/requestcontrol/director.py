"""The director: everything between a request's bytes and the endpoint it goes to, and its response hooks.

1. parse the body (JSON, completions or chat, `model`, `stream`, `cache_salt`) and apply the
   `x-gateway-model-name-rewrite` header; 2. admit: a sheddable request (priority < 0, from the
   objective named by `x-gateway-inference-objective`) is refused with 429 when the pool is
   saturated; 3. schedule on a snapshot of the datastore; 4. run the PreRequest hooks. Front ends
   then dispatch, and report the response back through `response_*`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from epick.config import LoadedConfig
from epick.datalayer.datastore import Datastore
from epick.framework import (
    BadRequestError,
    Endpoint,
    EndpointsFilteredError,
    InferenceRequest,
    NoEndpointsError,
    Response,
    SchedulingError,
    SchedulingResult,
    Snapshot,
)
from epick.framework.request import RequestKind
from epick.plugins.profile.disagg import DEFAULT_PREFILL_PROFILE
from epick.requestcontrol import errors
from epick.requestcontrol.errors import RequestError

log = logging.getLogger(__name__)

OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
PREFILL_HEADER = "x-prefiller-host-port"
REQUEST_ID_HEADER = "x-request-id"
CONTROL_HEADERS = frozenset({OBJECTIVE_HEADER, FAIRNESS_HEADER, MODEL_REWRITE_HEADER, DESTINATION_HEADER})


@dataclass(slots=True)
class Decision:
    request: InferenceRequest
    result: SchedulingResult
    body: bytes  # what to forward: the client's body, or re-encoded after a model rewrite
    client_model: str = ""  # the model the client asked for, before any rewrite
    prefill_profile: str = DEFAULT_PREFILL_PROFILE  # the config's (LoadedConfig.prefill_profile)

    @property
    def targets(self) -> tuple[Endpoint, ...]:
        return self.result.targets

    @property
    def prefill(self) -> Endpoint | None:
        """The prefill endpoint when the decision disaggregates (the prefill profile ran)."""
        return prefill_target(self.result, self.prefill_profile)


def prefill_target(result: SchedulingResult, prefill_profile: str) -> Endpoint | None:
    """The target of `prefill_profile` in a decision where it ran beside the primary profile."""
    r = result.profile_results.get(prefill_profile)
    if r is None or not r.targets or result.primary_profile == prefill_profile:
        return None
    return r.targets[0]


class Observer:
    """What the director reports for metrics; the default records nothing."""

    def scheduled(self, request: InferenceRequest, seconds: float) -> None:
        pass

    def request(self, model: str, target_model: str) -> None:
        pass

    def error(self, model: str, target_model: str, code: str) -> None:
        pass


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
    ) -> None:
        self.config = config
        self.datastore = datastore
        self.max_body_bytes = max_body_bytes
        self.objectives = dict(objectives or {})
        self.known_models = known_models
        self.observer = observer or Observer()

    def replace_config(self, config: LoadedConfig) -> None:
        """Swap in a new, fully built config (a bad one never gets here: loading raised first)."""
        self.config = config

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
        if not isinstance(raw, dict):
            raise errors.bad_request("request body must be a JSON object")
        lowered = {k.lower(): v for k, v in headers.items()}
        named = raw.get("model")
        client_model = named if isinstance(named, str) else ""
        rewrite = lowered.get(MODEL_REWRITE_HEADER)
        if rewrite:
            raw["model"] = rewrite
            body = json.dumps(raw).encode()
        objective = lowered.get(OBJECTIVE_HEADER, "")
        try:
            request = InferenceRequest.from_openai(
                raw,
                kind=kind,
                request_id=lowered.get(REQUEST_ID_HEADER) or uuid.uuid4().hex,
                headers={k: v for k, v in lowered.items() if k != DESTINATION_HEADER},
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
        return Decision(request, result, body, client_model, self.config.prefill_profile)

    def schedule(self, request: InferenceRequest, exclude: frozenset[str] = frozenset()) -> SchedulingResult:
        snapshot = self.datastore.snapshot()
        candidates: Snapshot | tuple[Endpoint, ...] = (
            tuple(ep for ep in snapshot if ep.name not in exclude) if exclude else snapshot
        )
        if not candidates:
            raise errors.no_endpoints()
        if request.priority < 0:
            endpoints = candidates.endpoints if isinstance(candidates, Snapshot) else candidates
            saturation = self.config.saturation_detector.pool_saturation(endpoints)
            if saturation >= 1.0:
                raise errors.shed(
                    f"pool saturated ({saturation:.2f}); sheddable request (priority {request.priority})"
                )
        start = time.perf_counter()
        try:
            result = self.config.scheduler.schedule(request, candidates)
        except NoEndpointsError as e:
            raise errors.no_endpoints(str(e)) from None
        except EndpointsFilteredError as e:
            raise errors.shed(str(e)) from None
        except SchedulingError as e:
            raise RequestError(503, str(e), "scheduling_failed") from None
        finally:
            self.observer.scheduled(request, time.perf_counter() - start)
        for hook in self.config.hooks.pre_request:
            _safely(hook.pre_request, request, result)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "scheduled %s model=%s profile=%s targets=%s",
                request.request_id,
                request.target_model,
                result.primary_profile,
                ",".join(ep.name for ep in result.targets),
            )
        return result

    # Response hooks, called by the front end as the response arrives.
    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        for hook in self.config.hooks.response_received:
            _safely(hook.response_received, request, response, endpoint)

    def response_streaming(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        for hook in self.config.hooks.response_streaming:
            _safely(hook.response_streaming, request, response, endpoint)

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        for hook in self.config.hooks.response_complete:
            _safely(hook.response_complete, request, response, endpoint)


def _safely(fn: Callable[..., Any], *args: Any) -> None:
    """A hook that raises is logged, never allowed to fail the request it observes."""
    try:
        fn(*args)
    except Exception:
        log.exception("request-control hook %r failed", getattr(fn, "__self__", fn))
