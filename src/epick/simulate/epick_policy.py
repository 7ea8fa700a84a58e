"""An epick config as a fleet-simulation policy: the real scheduler, plugins and request-control hooks.

Each request becomes an `InferenceRequest` (a completion whose prompt is the request's text); the
candidates are the servers with the metrics of their last scrape; `PreRequest` hooks run after each
decision (the approximate prefix index learns exactly as in the service) and `ResponseComplete`
hooks when the request finishes.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.config import LoadedConfig
from epick.framework import (
    Endpoint,
    InferenceRequest,
    Metrics,
    Reads,
    RequestBody,
    Response,
    SchedulingError,
    Snapshot,
    reads_of,
)
from epick.framework.endpoint import ROLE_LABEL
from epick.requestcontrol.director import prefill_target
from epick.simulate import vocab
from epick.simulate.types import RefusedError, ServerView, SimRequestSpec


class EpickPolicy:
    def __init__(self, name: str, config: LoadedConfig) -> None:
        self.name = name
        self.config = config
        # What the config's plugins declare they read: most never read the prompt, and then the
        # (costly) text is not built at all; metrics nobody reads are not refreshed.
        reads = Reads.NOTHING
        for plugin in config.plugins.values():
            reads |= reads_of(plugin)
        self.needs_text = bool(reads & (Reads.PROMPT | Reads.TOKENS))
        self.reads_metrics = bool(reads & Reads.METRICS)
        self._endpoints = Snapshot((), 0)
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
            endpoints = tuple(
                Endpoint(
                    v.name,
                    "10.0.0.1",
                    8000 + v.index,
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
            self._endpoints = Snapshot(endpoints, self._endpoints.version + 1)
        return self._endpoints

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        self._prefill = None
        if self.needs_text:
            body = RequestBody.completion(request.prompt)
        else:
            # Only the text's length is read: the text's own, or what building it would give.
            known = request.text
            length = len(known.encode()) if known is not None else vocab.text_length(len(request.tokens))
            body = RequestBody(kind="completion", prefix_bytes=length)
        # The client sends back what the last response of its session told it to (a session token).
        headers = self._session_headers.get(request.session, {}) if request.session else {}
        req = InferenceRequest(request.model, body, request.request_id, headers)
        candidates = self._candidates(servers)
        try:
            result = self.config.scheduler.schedule(req, candidates)
        except SchedulingError as e:
            # Nothing fits (every endpoint filtered out): the service answers 429 or 503, and the
            # request fails.
            raise RefusedError(f"refused by the scheduler: {e}") from None
        for hook in self.config.hooks.pre_request:
            hook.pre_request(req, result)
        target = result.targets[0]
        self._requests[request.request_id] = (req, target)
        # Disaggregated, as the service reads a decision: the prefill profile's target computes the
        # prompt when that profile ran and is not the primary.
        prefill = prefill_target(result, self.config.prefill_profile)
        if prefill is not None:
            self._prefill = int(prefill.port) - 8000
        return int(target.port) - 8000

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
