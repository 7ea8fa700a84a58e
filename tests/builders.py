"""Builders shared by the tests: endpoints, requests, schedulers, and a call-counting fake plugin."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from epick.framework import (
    ROLE_LABEL,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    NamedPlugin,
    ProfileLike,
    ProfileRunResult,
    Response,
    Scheduler,
    SchedulerProfile,
    SchedulingError,
    SchedulingResult,
    ScoredEndpoint,
    WeightedScorer,
)
from epick.plugins.pickers.max_score import MaxScorePicker
from epick.plugins.profile.single import SingleProfileHandler


def make_endpoint(
    name: str = "ep",
    *,
    queue: int = 0,
    running: int = 0,
    kv: float = 0.0,
    active: Sequence[str] = (),
    waiting: Sequence[str] = (),
    max_models: int = 0,
    role: str | None = None,
    labels: Mapping[str, str] | None = None,
    address: str = "10.0.0.1",
    port: int = 8000,
    update_time: float | None = None,
) -> Endpoint:
    all_labels = dict(labels or {})
    if role is not None:
        all_labels[ROLE_LABEL] = role
    metrics = Metrics(
        waiting_queue_size=queue,
        running_requests_size=running,
        kv_cache_usage_percent=kv,
        active_models=frozenset(active),
        waiting_models=frozenset(waiting),
        max_active_models=max_models,
        update_time=update_time,
    )
    return Endpoint(name, address, port, all_labels, metrics)


def make_request(
    prompt: str = "hello",
    *,
    model: str = "m",
    request_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    messages: list[dict[str, Any]] | None = None,
    **body: Any,
) -> InferenceRequest:
    raw: dict[str, Any] = {"model": model, **body}
    if messages is not None:
        raw["messages"] = messages
    else:
        raw["prompt"] = prompt
    return InferenceRequest.from_openai(raw, request_id=request_id, headers=dict(headers or {}))


def make_scheduler(*profiles: SchedulerProfile, handler: Any = None) -> Scheduler:
    by_name = {p.name: p for p in profiles}
    return Scheduler(by_name, handler or SingleProfileHandler())


def make_profile(
    name: str = "default",
    *,
    filters: Sequence[Any] = (),
    scorers: Sequence[tuple[Any, float]] = (),
    picker: Any = None,
    seed: int = 0,
) -> SchedulerProfile:
    import random

    return SchedulerProfile(
        name,
        picker or MaxScorePicker(rng=random.Random(seed)),
        list(filters),
        [WeightedScorer(s, w) for s, w in scorers],
    )


class FakePlugin(NamedPlugin):
    """Implements every extension point, counts calls, and does what it is told.

    filter: keeps endpoints whose names are in `keep` (all when None); score: `scores[name]`
    (default 0.5); pick: the endpoint named `choose`, else the first; handler: runs `run` profiles
    in order, one per call, then merges with the first as primary.
    """

    plugin_type = "fake"

    def __init__(
        self,
        name: str = "fake",
        *,
        keep: set[str] | None = None,
        scores: Mapping[str, float] | None = None,
        choose: str | None = None,
        run: Sequence[str] = ("default",),
    ) -> None:
        super().__init__(name)
        self.keep = keep
        self.scores = dict(scores or {})
        self.choose = choose
        self.run = list(run)
        self.calls: list[str] = []
        self.seen: list[Any] = []

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        self.calls.append("filter")
        self.seen.append([ep.name for ep in endpoints])
        return [ep for ep in endpoints if self.keep is None or ep.name in self.keep]

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        self.calls.append("score")
        return [self.scores.get(ep.name, 0.5) for ep in endpoints]

    def pick(
        self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> Any:
        self.calls.append("pick")
        for s in scored:
            if s.endpoint.name == self.choose:
                return ProfileRunResult((s.endpoint,))
        return ProfileRunResult((scored[0].endpoint,))

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        self.calls.append("pre_request")

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self.calls.append("response_received")

    def response_streaming(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self.calls.append("response_streaming")

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self.calls.append("response_complete")


class ScriptedHandler(NamedPlugin):
    """A profile handler that runs `order` one profile per `pick_profiles`, recording what each call saw."""

    plugin_type = "scripted-handler"

    def __init__(self, order: Sequence[str], primary: str | None = None) -> None:
        super().__init__("scripted")
        self.order = list(order)
        self.primary = primary or self.order[0]
        self.seen_results: list[dict[str, list[str] | None]] = []

    def pick_profiles(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        profiles: Mapping[str, ProfileLike],
        results: Mapping[str, ProfileRunResult | None],
    ) -> list[str]:
        self.seen_results.append(
            {k: [ep.name for ep in v.targets] if v is not None else None for k, v in results.items()}
        )
        remaining = [p for p in self.order if p not in results]
        return remaining[:1]

    def process_results(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        if results.get(self.primary) is None:
            raise SchedulingError(f"profile {self.primary!r} produced no result", profile=self.primary)
        return SchedulingResult(dict(results), self.primary)


def schedule_and_record(
    config: Any, request: InferenceRequest, candidates: Sequence[Endpoint]
) -> SchedulingResult:
    """A scheduling call, then the config's PreRequest hooks with that call's cycle state, as the
    request path runs them (`config` is a LoadedConfig)."""
    cycle_state = CycleState()
    result: SchedulingResult = config.scheduler.schedule(request, candidates, cycle_state=cycle_state)
    for hook in config.hooks.pre_request:
        hook.pre_request(request, result, cycle_state)
    return result
