"""`session-state-producer`: upstream's producer_test.go cases (llm-d-router sessionstate at 8325bfae),
the eviction sweep on its grid, and the hooks driven through a loaded config: header processors,
produce and PreRequest on the request path, then ResponseComplete."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from epick.config import ConfigError, LoadedConfig, LoadOptions, load_config_text
from epick.framework import Clock, CycleState, ProfileRunResult, Response, SchedulingResult, Usage
from epick.framework.flowcontrol import AGENT_IDENTITY_KEY
from epick.plugins import in_tree_registry
from epick.plugins.registry import Registry
from epick.plugins.session.state_producer import (
    SPEC,
    SessionRegistry,
    SessionState,
    SessionStateParameters,
    SessionStateProducer,
    read_session_state,
    session_state_key,
)
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
AGENT = "x-claude-code-session-id"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry() -> Registry:
    r = in_tree_registry()
    if SPEC.type not in r:
        r.register(SPEC)
    return r


def load(body: str, clock: FakeClock | None = None, staleness: float = 300.0) -> LoadedConfig:
    options = LoadOptions(clock=Clock(clock) if clock else None, plugin_state_staleness=staleness)
    return load_config_text(
        HEADER + textwrap.dedent(body), seed=0, registry=registry(), options=options, source="t.yaml"
    )


def producer(clock: FakeClock, **params: Any) -> SessionStateProducer:
    return SessionStateProducer(params=SessionStateParameters(**params), clock=clock)


def with_identity(identity: str | None) -> CycleState:
    state = CycleState()
    if identity is not None:
        state.write(AGENT_IDENTITY_KEY, identity)
    return state


def decided(profiles: int = 1) -> SchedulingResult:
    results = {chr(ord("a") + i): ProfileRunResult((make_endpoint(f"e{i}"),)) for i in range(profiles)}
    return SchedulingResult(results, "a")


def observe(p: SessionStateProducer, identity: str = "session-a") -> SessionState:
    """What a next request of the session would be told."""
    state = with_identity(identity)
    p.produce(make_request(), state, [])
    found = read_session_state(state, p.name)
    assert found is not None
    return found


def dispatch(p: SessionStateProducer, identity: str = "session-a", profiles: int = 1) -> Any:
    request = make_request()
    state = with_identity(identity)
    p.produce(request, state, [])
    p.pre_request(request, decided(profiles), state)
    return request


def end(p: SessionStateProducer, request: Any, error: str | None = None, usage: Usage | None = None) -> None:
    response = Response(request.request_id, end_of_stream=True, error=error, usage=usage)
    p.response_complete(request, response, make_endpoint("e0"))


def test_the_key_and_defaults_are_upstreams() -> None:
    assert session_state_key() == "SessionStateDataKey/session-state-producer"
    p = SessionStateProducer()
    assert p.key == "SessionStateDataKey/session-state-producer"
    assert (p.ttl, p.sweep) == (3600.0, 300.0)
    assert SessionStateProducer("custom").key == "SessionStateDataKey/custom"


def test_without_an_agent_identity_nothing_happens() -> None:
    clock = FakeClock()
    p = producer(clock)
    for state in (with_identity(None), with_identity("")):
        request = make_request()
        p.produce(request, state, [])
        p.pre_request(request, decided(), state)
        assert state.keys() in ([], [AGENT_IDENTITY_KEY])
    assert len(p.registry) == 0
    # a session id of session-id-producer's is not an agent identity
    state = CycleState()
    state.write("SessionIDDataKey/session-id-producer", "session-a")
    p.produce(make_request(), state, [])
    assert read_session_state(state) is None


def test_produce_then_pre_request_track_history() -> None:
    clock = FakeClock()
    p = producer(clock)
    first = observe(p)
    assert first == SessionState(last_seen_at=1000.0)  # a new session: seen now, nothing yet
    end(p, make_request())  # a response of a request never dispatched: nothing
    dispatch(p)  # produce (seen at 1000) and PreRequest: a turn, one in flight
    clock.now = 1007.5
    second = observe(p)
    assert second.turns_taken == 1
    assert second.in_flight_requests == 1
    assert second.duration == 7.5  # since first seen
    assert second.last_seen_at == 1000.0  # the previous request's time
    clock.now = 1010.0
    assert observe(p).last_seen_at == 1007.5


def test_a_request_counts_once_however_many_profiles_or_decisions() -> None:
    clock = FakeClock()
    p = producer(clock)
    request = dispatch(p, profiles=2)
    state = with_identity("session-a")
    p.pre_request(request, decided(), state)  # decided again (a retry): the same turn
    assert observe(p).turns_taken == 1
    assert observe(p).in_flight_requests == 1


def test_only_natural_completions_count_with_their_tokens() -> None:
    clock = FakeClock()
    p = producer(clock)
    request = dispatch(p)
    end(p, request, usage=Usage(prompt_tokens=12, completion_tokens=34))
    state = observe(p)
    assert (state.in_flight_requests, state.completed_requests) == (0, 1)
    assert (state.total_input_tokens, state.total_output_tokens) == (12, 34)
    end(p, request, usage=Usage(prompt_tokens=12, completion_tokens=34))  # reported twice: once only
    assert observe(p).completed_requests == 1


@pytest.mark.parametrize("error", ["client disconnected", "request deadline passed", "ReadError: reset"])
def test_an_abnormal_end_only_leaves_the_in_flight_count(error: str) -> None:
    p = producer(FakeClock())
    request = dispatch(p)
    end(p, request, error=error, usage=Usage(prompt_tokens=12, completion_tokens=34))
    state = observe(p)
    assert (state.in_flight_requests, state.completed_requests) == (0, 0)
    assert (state.total_input_tokens, state.total_output_tokens) == (0, 0)


def test_a_natural_end_without_usage_counts_zero_tokens() -> None:
    p = producer(FakeClock())
    end(p, dispatch(p))
    state = observe(p)
    assert (state.completed_requests, state.total_input_tokens, state.total_output_tokens) == (1, 0, 0)


def test_an_error_status_answered_whole_is_a_natural_end() -> None:
    p = producer(FakeClock())
    request = dispatch(p)
    response = Response(request.request_id, status=400, end_of_stream=True, usage=None)
    p.response_complete(request, response, make_endpoint("e0"))
    assert observe(p).completed_requests == 1


def test_sessions_are_kept_apart() -> None:
    p = producer(FakeClock())
    dispatch(p, "a")
    dispatch(p, "a")
    dispatch(p, "b")
    assert observe(p, "a").turns_taken == 2
    assert observe(p, "b").turns_taken == 1
    assert observe(p, "c").turns_taken == 0


def test_idle_sessions_are_evicted_on_the_sweep_grid() -> None:
    clock = FakeClock()
    p = producer(clock, eviction_ttl_seconds=10, eviction_sweep_seconds=4)  # ticks at 1004, 1008, ...
    dispatch(p, "busy")  # in flight: kept however idle
    end(p, dispatch(p, "idle"))
    clock.now = 1011.0  # tick 1008: idle 8 s, kept
    observe(p, "other")
    assert observe(p, "idle").turns_taken == 1  # and this marks it seen at 1011
    clock.now = 1022.0  # ticks 1012..1020: idle since 1011, 9 s at 1020: kept
    assert observe(p, "idle").turns_taken == 1  # seen at 1022
    clock.now = 1035.0  # tick 1032: idle 10 s, not more: kept
    assert observe(p, "idle").turns_taken == 1  # seen at 1035
    clock.now = 1049.9  # tick 1048: 13 s > 10: evicted, and the busy one kept
    assert observe(p, "idle").turns_taken == 0
    assert observe(p, "busy").turns_taken == 1


def test_a_zero_ttl_never_evicts() -> None:
    clock = FakeClock()
    p = producer(clock, eviction_ttl_seconds=0, eviction_sweep_seconds=1)
    end(p, dispatch(p))
    clock.now += 10**6
    assert observe(p).completed_requests == 1


def test_a_request_never_completed_is_released_after_the_staleness() -> None:
    clock = FakeClock()
    p = SessionStateProducer(clock=clock, stale_after=60.0)
    request = dispatch(p)
    clock.now = 1060.0
    assert observe(p).in_flight_requests == 1
    clock.now = 1060.5
    state = observe(p)
    assert (state.in_flight_requests, state.completed_requests) == (0, 0)
    end(p, request)  # too late: nothing
    assert observe(p).completed_requests == 0


def test_the_registry_alone() -> None:
    r = SessionRegistry()
    r.record_response("s", True, 1, 1)  # nothing in flight: nothing
    r.record_dispatch("s", 5.0)
    assert r.get_state("s", 7.0) == SessionState(1, 2.0, 5.0, 1, 0, 0, 0)
    r.record_response("s", True, 3, 4)
    r.record_response("s", True, 3, 4)  # in flight already 0
    assert r.get_state("s", 9.0) == SessionState(1, 4.0, 7.0, 0, 1, 3, 4)
    r.evict_idle(19.0, 10.0)  # idle 10 s since 9: not more than the ttl
    assert len(r) == 1
    r.evict_idle(19.5, 0.0)  # a ttl of 0 evicts nothing
    assert len(r) == 1
    r.evict_idle(19.5, 10.0)
    assert len(r) == 0


def test_dump_state_has_counts_and_no_session_ids() -> None:
    p = producer(FakeClock())
    dispatch(p, "secret-session")
    dumped = p.dump_state()
    assert dumped == {
        "sessions": 1,
        "inFlightRequests": 1,
        "trackedRequests": 1,
        "evictionTtlSeconds": 3600.0,
        "evictionSweepSeconds": 300.0,
    }
    assert "secret-session" not in repr(dumped)


CONFIG = """\
plugins:
- type: agent-identity
- type: session-state-producer
  parameters:
    evictionTtlSeconds: 12.5
    evictionSweepSeconds: 1.5
- type: random-picker
"""


def test_through_a_config_pre_request_then_response_complete() -> None:
    clock = FakeClock()
    config = load(CONFIG, clock)
    p = config.plugins["session-state-producer"]
    assert isinstance(p, SessionStateProducer)
    assert (p.ttl, p.sweep) == (12.5, 1.5)
    assert p in config.hooks.producers and p in config.hooks.pre_request
    assert p in config.hooks.response_complete
    assert config.worker_states["session-state-producer"]  # per worker, said so
    path = RequestPath(config)
    eps = (make_endpoint("a"), make_endpoint("b"))
    headers = {AGENT: "agent-42"}

    first = make_request(headers=headers)
    state = path.read_headers(first)
    result = path.decide_admitted(first, state, eps)
    assert read_session_state(state) == SessionState(last_seen_at=1000.0)
    clock.now = 1002.0
    second = make_request(headers=headers)
    state = path.read_headers(second)
    path.decide_admitted(second, state, eps)
    seen = read_session_state(state)
    assert seen is not None
    assert (seen.turns_taken, seen.in_flight_requests, seen.duration) == (1, 1, 2.0)

    for request, usage in ((first, Usage(10, 20)), (second, Usage(1, 2))):
        response = Response(request.request_id, end_of_stream=True, usage=usage)
        for hook in config.hooks.response_complete:
            hook.response_complete(request, response, result.targets[0])
    third = make_request(headers=headers)
    state = path.read_headers(third)
    path.decide_admitted(third, state, eps)
    seen = read_session_state(state)
    assert seen is not None
    assert (seen.turns_taken, seen.in_flight_requests, seen.completed_requests) == (2, 0, 2)
    assert (seen.total_input_tokens, seen.total_output_tokens) == (11, 22)

    # a request without an agent identity header: no state
    anonymous = make_request()
    state = path.read_headers(anonymous)
    path.decide_admitted(anonymous, state, eps)
    assert read_session_state(state) is None


def test_without_agent_identity_in_the_config_it_sees_nothing() -> None:
    config = load("plugins:\n- type: session-state-producer\n- type: random-picker\n")
    path = RequestPath(config)
    request = make_request(headers={AGENT: "agent-42"})
    state = path.read_headers(request)
    path.decide_admitted(request, state, (make_endpoint("a"),))
    assert read_session_state(state) is None


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ("{evictionTtlSeconds: -1, evictionSweepSeconds: 10}", "evictionTtlSeconds"),
        ("{evictionSweepSeconds: 0}", "evictionSweepSeconds"),
        ("{evictionSweepSeconds: -1}", "evictionSweepSeconds"),
        ("{evictionTtlSeconds: .inf}", "evictionTtlSeconds"),
        ("{unknown: 1}", "unknown"),
    ],
)
def test_parameter_errors(parameters: str, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(f"plugins:\n- type: session-state-producer\n  parameters: {parameters}\n- type: random-picker\n")
    assert any(field in issue.path or field in issue.message for issue in e.value.issues), e.value


def test_zero_ttl_is_accepted() -> None:
    config = load(
        "plugins:\n- type: session-state-producer\n"
        "  parameters: {evictionTtlSeconds: 0}\n"
        "- type: random-picker\n"
    )
    p = config.plugins["session-state-producer"]
    assert isinstance(p, SessionStateProducer)
    assert (p.ttl, p.sweep) == (0.0, 300.0)
