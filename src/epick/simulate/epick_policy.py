"""An epick config as a fleet-simulation policy: the real scheduler, plugins and request-control hooks.

Each request becomes an `InferenceRequest` (a completion whose prompt is the request's text); the
candidates are the servers with the metrics of their last scrape; `PreRequest` hooks run after each
decision (the approximate prefix index learns exactly as in the service) and `ResponseComplete`
hooks when the request finishes.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.config import LoadedConfig
from epick.framework import Endpoint, InferenceRequest, Metrics, RequestBody, Response, SchedulingError
from epick.simulate.types import ServerView, SimRequestSpec


class EpickPolicy:
    def __init__(self, name: str, config: LoadedConfig) -> None:
        self.name = name
        self.config = config
        self._endpoints: list[Endpoint] = []
        self._snapshot_key: tuple[object, ...] = ()
        self._requests: dict[str, tuple[InferenceRequest, Endpoint]] = {}
        self.errors = 0

    def _candidates(self, servers: Sequence[ServerView]) -> list[Endpoint]:
        key = tuple((v.waiting, v.running, v.kv_usage, v.active_models, v.waiting_models) for v in servers)
        if key != self._snapshot_key or len(self._endpoints) != len(servers):
            self._snapshot_key = key
            self._endpoints = [
                Endpoint(
                    v.name,
                    "10.0.0.1",
                    8000 + v.index,
                    {},
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
            ]
        return self._endpoints

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        req = InferenceRequest(request.model, RequestBody.completion(request.text), request.request_id)
        candidates = self._candidates(servers)
        try:
            result = self.config.scheduler.schedule(req, candidates)
        except SchedulingError:
            # Nothing fits (every endpoint filtered): a gateway would answer 429; the fleet sends it
            # to the least loaded server so the run goes on, and counts the refusal.
            self.errors += 1
            return min(range(len(servers)), key=lambda i: (servers[i].waiting, servers[i].running))
        for hook in self.config.hooks.pre_request:
            hook.pre_request(req, result)
        target = result.targets[0]
        self._requests[request.request_id] = (req, target)
        return int(target.port) - 8000

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        entry = self._requests.pop(request.request_id, None)
        if entry is None:
            return
        req, endpoint = entry
        response = Response(req.request_id, end_of_stream=True)
        for hook in self.config.hooks.response_complete:
            hook.response_complete(req, response, endpoint)
