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
from epick.framework.endpoint import ROLE_LABEL
from epick.plugins.filters.by_label import ByLabelFilter
from epick.plugins.filters.classic import (
    DecisionTreeFilter,
    LeastKVCacheFilter,
    LeastQueueFilter,
    LoraAffinityFilter,
    LowQueueFilter,
)
from epick.plugins.filters.label_selector import LabelSelectorFilter
from epick.plugins.filters.role import RoleFilter
from epick.plugins.filters.utilization import UtilizationDetector
from epick.plugins.pickers.max_score import MaxScorePicker
from epick.plugins.pickers.random_picker import RandomPicker
from epick.plugins.pickers.round_robin import RoundRobinPicker
from epick.plugins.pickers.weighted_random import WeightedRandomPicker
from epick.plugins.prefix.scorer import PrefixCacheScorer
from epick.plugins.prerequest.prefill_header import PrefillHeaderHandler
from epick.plugins.profile.deciders import AlwaysDisaggDecider, PrefixBasedDecider
from epick.plugins.profile.disagg import DisaggProfileHandler
from epick.plugins.profile.shadow import ShadowProfileHandler
from epick.plugins.profile.single import SingleProfileHandler
from epick.plugins.scorers.active_request import ActiveRequestScorer
from epick.plugins.scorers.kv_cache import KVCacheUtilizationScorer
from epick.plugins.scorers.load_aware import LoadAwareScorer
from epick.plugins.scorers.lora_affinity import LoraAffinityScorer
from epick.plugins.scorers.no_hit_lru import NoHitLruScorer
from epick.plugins.scorers.queue import QueueScorer
from epick.plugins.scorers.running_requests import RunningRequestsSizeScorer
from epick.plugins.scorers.session_affinity import SessionAffinityScorer
from epick.plugins.scorers.token_load import TokenLoadScorer
from epick.requestcontrol.director import prefill_target
from epick.simulate import vocab
from epick.simulate.types import RefusedError, ServerView, SimRequestSpec

# In-tree plugins that never read the prompt text (the token-load scorer and the prefix-based decider
# read only its length, which `route` gives without the text).
TEXT_BLIND = (
    ActiveRequestScorer,
    AlwaysDisaggDecider,
    ByLabelFilter,
    DecisionTreeFilter,
    LeastKVCacheFilter,
    LeastQueueFilter,
    LoraAffinityFilter,
    LowQueueFilter,
    DisaggProfileHandler,
    KVCacheUtilizationScorer,
    LabelSelectorFilter,
    LoadAwareScorer,
    LoraAffinityScorer,
    MaxScorePicker,
    NoHitLruScorer,
    PrefillHeaderHandler,
    PrefixBasedDecider,
    QueueScorer,
    RandomPicker,
    RoleFilter,
    RoundRobinPicker,
    RunningRequestsSizeScorer,
    SessionAffinityScorer,
    ShadowProfileHandler,
    SingleProfileHandler,
    TokenLoadScorer,
    UtilizationDetector,
    WeightedRandomPicker,
)

# In-tree plugins that never read an endpoint's scraped metrics.
METRICS_BLIND = (
    ActiveRequestScorer,
    AlwaysDisaggDecider,
    ByLabelFilter,
    DecisionTreeFilter,
    DisaggProfileHandler,
    LabelSelectorFilter,
    MaxScorePicker,
    NoHitLruScorer,
    PrefillHeaderHandler,
    PrefixBasedDecider,
    PrefixCacheScorer,
    RandomPicker,
    RoleFilter,
    RoundRobinPicker,
    SessionAffinityScorer,
    ShadowProfileHandler,
    SingleProfileHandler,
    TokenLoadScorer,
    WeightedRandomPicker,
)


class EpickPolicy:
    def __init__(self, name: str, config: LoadedConfig) -> None:
        self.name = name
        self.config = config
        # Most plugins never read the prompt; then the (costly) text is not built at all.
        self.needs_text = not all(isinstance(p, TEXT_BLIND) for p in config.plugins.values())
        self.reads_metrics = not all(isinstance(p, METRICS_BLIND) for p in config.plugins.values())
        self._endpoints: tuple[Endpoint, ...] = ()
        self._snapshot_key: tuple[object, ...] = ()
        self._requests: dict[str, tuple[InferenceRequest, Endpoint]] = {}
        self._prefill: int | None = None  # the prefill server of the request routed last
        self._session_headers: dict[str, dict[str, str]] = {}  # per session: from its last response

    def _candidates(self, servers: Sequence[ServerView]) -> tuple[Endpoint, ...]:
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
            self._endpoints = tuple(
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
