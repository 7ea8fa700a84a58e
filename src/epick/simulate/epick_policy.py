"""An epick config as a fleet-simulation policy: the service's own request path on simulated servers.

Each request becomes the `InferenceRequest` the service would build (a completion whose prompt is
the request's text, spelt only if a plugin reads it); the candidates are the servers, named as the
fleet names them, with the metrics of their last scrape; `RequestPath.decide` admits, schedules and
runs the PreRequest hooks exactly as for the proxy and ext_proc, and the response hooks run when the
request finishes.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.config import LoadedConfig
from epick.framework import (
    ROLE_LABEL,
    Endpoint,
    InferenceRequest,
    Metrics,
    Reads,
    RequestBody,
    Response,
    Snapshot,
    reads_of,
)
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.path import RequestPath
from epick.simulate import vocab
from epick.simulate.types import RefusedError, ServerView, SimRequestSpec


class EpickPolicy:
    def __init__(self, name: str, config: LoadedConfig) -> None:
        self.name = name
        self.config = config
        self.path = RequestPath(config)
        # Metrics nobody reads (by the plugins' declarations) need no scrape.
        self.reads_metrics = any(reads_of(p) & Reads.METRICS for p in config.plugins.values())
        self._endpoints = Snapshot((), 0)
        self._servers: dict[str, int] = {}  # endpoint name -> server index
        self._snapshot_key: tuple[object, ...] = ()
        self._requests: dict[str, tuple[InferenceRequest, Endpoint]] = {}
        self._prefill: int | None = None  # the prefill server of the request routed last
        self._session_headers: dict[str, dict[str, str]] = {}  # per session: from its last response

    def _candidates(self, servers: Sequence[ServerView]) -> Snapshot:
        if not self.reads_metrics:
            key: tuple[object, ...] = (len(servers),)  # metrics nobody reads need no refresh
        elif servers and servers[0].epoch:
            key = (servers[0].epoch, len(servers))  # the fleet says when they change
        else:
            key = tuple(
                (v.waiting, v.running, v.kv_usage, v.active_models, v.waiting_models) for v in servers
            )
        if key != self._snapshot_key or len(self._endpoints) != len(servers):
            self._snapshot_key = key
            # A simulated server has no address: it is known by its name (port 0 marks that).
            endpoints = tuple(
                Endpoint(
                    v.name,
                    v.name,
                    0,
                    {ROLE_LABEL: v.role} if v.role else {},
                    Metrics(
                        waiting_queue_size=v.waiting,
                        running_requests_size=v.running,
                        kv_cache_usage_percent=v.kv_usage,
                        active_models=v.active_models,
                        waiting_models=v.waiting_models,
                        max_active_models=v.max_models,
                    ),
                )
                for v in servers
            )
            self._servers = {v.name: v.index for v in servers}
            self._endpoints = Snapshot(endpoints, self._endpoints.version + 1)
        return self._endpoints

    def request(self, spec: SimRequestSpec) -> InferenceRequest:
        """The request as the service would parse it; the prompt is spelt only when a plugin reads it
        (its length is known without it: the text's own, or what spelling it gives)."""
        known = spec.text
        length = len(known.encode()) if known is not None else vocab.text_length(len(spec.tokens))
        body = RequestBody.lazy_completion(length, lambda: spec.prompt)
        # The client sends back what the last response of its session told it to (a session token).
        headers = self._session_headers.get(spec.session, {}) if spec.session else {}
        return InferenceRequest(spec.model, body, spec.request_id, headers)

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        self._prefill = None
        req = self.request(request)
        try:
            result = self.path.decide(req, self._candidates(servers))
        except RequestError as e:
            # Nothing fits (every endpoint filtered out, or shed): the service answers 429 or 503,
            # and the request fails.
            raise RefusedError(f"refused by the scheduler: {e.message}") from None
        target = result.targets[0]
        self._requests[request.request_id] = (req, target)
        prefill = result.prefill
        if prefill is not None:
            self._prefill = self._servers[prefill.name]
        return self._servers[target.name]

    def prefill_server(self, request: SimRequestSpec) -> int | None:
        return self._prefill

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        """The response hooks, in the order the service runs them: headers received, then complete
        (the simulation has no separate event for the first)."""
        entry = self._requests.pop(request.request_id, None)
        if entry is None:
            return
        hooks = self.config.hooks
        if not hooks.response_received and not hooks.response_complete:
            return
        req, endpoint = entry
        response = Response(req.request_id)
        for received in hooks.response_received:
            received.response_received(req, response, endpoint)
        if request.session and response.add_headers:
            self._session_headers[request.session] = dict(response.add_headers)
        response.end_of_stream = True
        for complete in hooks.response_complete:
            complete.response_complete(req, response, endpoint)
