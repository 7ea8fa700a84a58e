"""`session-id-producer`, `session-affinity-filter` and `utilization-filter`, with values worked out by
hand from upstream's rules (llm-d-router's dataproducer/sessionid, scheduling/filter/sessionaffinity,
scheduling/util/sessionaffinity and scheduling/filter/utilization packages)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import yaml

from epick.config import ConfigError, LoadedConfig, load_config_text
from epick.framework import CycleState, Endpoint, ProfileRunResult, Response, SchedulingResult
from epick.plugins import in_tree_registry
from epick.plugins.filters import utilization_filter
from epick.plugins.filters.utilization_filter import UtilizationFilter
from epick.plugins.load.inflight import InFlightLoadProducer
from epick.plugins.registry import ParameterError, Registry
from epick.plugins.scorers.session_affinity import SessionAffinityScorer
from epick.plugins.session import filter as session_filter
from epick.plugins.session import producer as session_producer
from epick.plugins.session.filter import (
    SessionAffinityFilter,
    SessionAffinityParameters,
    SessionIdConfig,
    SessionIdSource,
    decode_token,
    endpoint_token,
)
from epick.plugins.session.producer import (
    SessionIdParameters,
    SessionIdProducer,
    cookie_value,
    read_session_id,
    session_id_key,
)
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request


def registry() -> Registry:
    reg = in_tree_registry()
    for spec in (session_producer.SPEC, session_filter.SPEC, utilization_filter.SPEC):
        if spec.type not in reg:
            reg.register(spec)
    return reg


REGISTRY = registry()
PATH = "plugins[0].parameters"


def load(plugins: list[dict[str, Any]]) -> LoadedConfig:
    doc = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": plugins}
    return load_config_text(yaml.safe_dump(doc, sort_keys=False), source="test.yaml", registry=REGISTRY)


def make(plugin_type: str, parameters: Mapping[str, Any] | None = None, name: str = "p") -> Any:
    entry: dict[str, Any] = {"name": name, "type": plugin_type}
    if parameters is not None:
        entry["parameters"] = dict(parameters)
    return load([entry]).plugins[name]


def issues(plugin_type: str, parameters: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The loader's issues, (path, message), for one plugin of `plugin_type`."""
    with pytest.raises(ConfigError) as e:
        make(plugin_type, parameters)
    return [(issue.path, issue.message) for issue in e.value.issues]


def names(endpoints: Sequence[Endpoint]) -> list[str]:
    return [ep.name for ep in endpoints]


def decided(*profiles: tuple[str, str | None], primary: str | None = None) -> SchedulingResult:
    results = {
        name: (ProfileRunResult((make_endpoint(target),)) if target else None) for name, target in profiles
    }
    return SchedulingResult(results, primary or profiles[0][0])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- session-id-producer ------------------------------------------------------------------------


def test_producer_reads_the_named_cookie_of_the_spec_example() -> None:
    p = make("session-id-producer", {"cookieName": "llm-d-session"}, name="session-id-producer")
    state = CycleState()
    p.produce(make_request(headers={"cookie": "a=1; llm-d-session=abc; b=2"}), state, [])
    assert state.read("SessionIDDataKey/session-id-producer", str) == "abc"
    assert read_session_id(state) == "abc"


def test_cookie_parsing_follows_upstream() -> None:
    assert cookie_value("llm-d-session=abc123", "llm-d-session") == "abc123"
    assert cookie_value("no-equals; llm-d-session=abc", "llm-d-session") == "abc"  # a pair without = skipped
    assert cookie_value("llm-d-session=", "llm-d-session") == ""
    assert cookie_value("x=1; llm-d-session=a=b", "llm-d-session") == "a=b"  # split at the first =
    assert cookie_value("LLM-D-SESSION=abc", "llm-d-session") == ""  # names are case-sensitive
    assert cookie_value("s=first; s=second", "s") == "first"
    p = SessionIdProducer(params=SessionIdParameters(cookie_name=" llm-d-session "))
    assert p.session_id(make_request(headers={"cookie": "llm-d-session= abc123 ; other=v"})) == "abc123"


def test_header_name_is_trimmed_and_lowercased_and_the_value_trimmed() -> None:
    p = make("session-id-producer", {"headerName": " X-Session-ID "}, name="sid")
    state = CycleState()
    p.produce(make_request(headers={"X-Session-Id": "  user-42 "}), state, [])
    assert state.read(session_id_key("sid"), str) == "user-42"  # a named producer writes under its name
    assert read_session_id(state) is None


def test_no_or_blank_session_id_writes_nothing() -> None:
    p = SessionIdProducer(params=SessionIdParameters(header_name="x-session-id"))
    state = CycleState()
    p.produce(make_request(), state, [])
    p.produce(make_request(headers={"x-session-id": "   "}), state, [])
    assert state.keys() == []


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (None, "requires exactly one of headerName or cookieName to be set"),
        ({"headerName": " ", "cookieName": ""}, "requires exactly one of headerName or cookieName to be set"),
        ({"headerName": "x", "cookieName": "y"}, "to be set, not both"),
    ],
)
def test_producer_needs_exactly_one_source(parameters: dict[str, str] | None, message: str) -> None:
    [(path, text)] = issues("session-id-producer", parameters)
    assert path == f"{PATH}.headerName"
    assert message in text


def test_producer_refuses_unknown_parameters() -> None:
    [(path, _)] = issues("session-id-producer", {"headerName": "x", "other": "y"})
    assert path == f"{PATH}.other"


# --- session-affinity-filter: encoded_endpoint_header -------------------------------------------


def test_token_is_base64_of_the_endpoint_name() -> None:
    assert endpoint_token("default/vllm-0") == "ZGVmYXVsdC92bGxtLTA="  # the spec's example, ns/name
    assert endpoint_token("vllm-0") == "dmxsbS0w"  # epick's endpoint name
    assert decode_token("dmxsbS0w") == "vllm-0"
    assert decode_token("not base64!") == ""
    assert decode_token("dmxsbS0") == ""  # padding missing: StdEncoding refuses it
    assert decode_token("") == ""


def test_encoded_header_round_trip() -> None:
    f = make("session-affinity-filter")
    a, b, c = make_endpoint("vllm-0"), make_endpoint("vllm-1"), make_endpoint("vllm-2")
    first = make_request(request_id="r1")
    assert names(f.filter(first, CycleState(), [a, b, c])) == ["vllm-0", "vllm-1", "vllm-2"]
    response = Response("r1")
    f.response_received(first, response, b)
    assert response.add_headers == {"x-session-token": "dmxsbS0x"}
    again = make_request(request_id="r2", headers={"x-session-token": "dmxsbS0x"})
    assert names(f.filter(again, CycleState(), [a, b, c])) == ["vllm-1"]
    # Its endpoint gone, a bad token, or none: every candidate passes.
    assert names(f.filter(again, CycleState(), [a, c])) == ["vllm-0", "vllm-2"]
    bad = make_request(headers={"x-session-token": "%%%"})
    assert names(f.filter(bad, CycleState(), [a, b])) == ["vllm-0", "vllm-1"]


def test_encoded_header_reads_the_scorer_tokens_and_a_custom_header() -> None:
    f = make("session-affinity-filter", {"encodedEndpointHeaderConfig": {"header": " X-Pin "}})
    a, b = make_endpoint("a"), make_endpoint("b")
    response = Response("r1")
    SessionAffinityScorer().response_received(make_request(), response, b)
    token = response.add_headers["x-session-token"]
    assert names(f.filter(make_request(headers={"x-pin": token}), CycleState(), [a, b])) == ["b"]
    mine = Response("r2")
    f.response_received(make_request(), mine, a)
    assert mine.add_headers == {"x-pin": endpoint_token("a")}


def test_encoded_header_with_a_profile_name_writes_that_profiles_target() -> None:
    f = make("session-affinity-filter", {"profileName": "prefill"})
    served_by = make_endpoint("decode-0")
    request = make_request(request_id="r1")
    f.pre_request(request, decided(("decode", "decode-0"), ("prefill", "prefill-3")), CycleState())
    response = Response("r1")
    f.response_received(request, response, served_by)
    assert response.add_headers == {"x-session-token": endpoint_token("prefill-3")}
    # The prefill profile did not run (decode only): no header.
    later = make_request(request_id="r2")
    f.pre_request(later, decided(("decode", "decode-0"), ("prefill", None)), CycleState())
    response = Response("r2")
    f.response_received(later, response, served_by)
    assert response.add_headers == {}
    assert f._pending == {}


# --- session-affinity-filter: session_id --------------------------------------------------------


def session_filter_with(clock: FakeClock, **config: Any) -> SessionAffinityFilter:
    params = SessionAffinityParameters(strategy="session_id", session_id_config=SessionIdConfig(**config))
    return SessionAffinityFilter("sa", params, clock=clock)


def run(
    f: SessionAffinityFilter, request_id: str, candidates: list[Endpoint], picked: str | None = None
) -> list[str]:
    """One request of session s1: the filter's survivors; then PreRequest with `picked` (None: the
    first survivor)."""
    request = make_request(request_id=request_id, headers={"x-session-id": "s1"})
    state = CycleState()
    kept = names(f.filter(request, state, candidates))
    f.pre_request(request, decided(("decode", picked or kept[0])), state)
    return kept


def test_session_binds_then_pins_and_moves_only_when_its_endpoint_was_absent() -> None:
    clock = FakeClock()
    f = session_filter_with(clock)
    a, b, c = make_endpoint("A"), make_endpoint("B"), make_endpoint("C")
    assert run(f, "r1", [a, b, c], picked="B") == ["A", "B", "C"]  # unbound: all pass; then bound to B
    assert f.bound_endpoint("s1") == "B"
    assert run(f, "r2", [a, b, c]) == ["B"]
    # B was a candidate but the picker went elsewhere (a later filter's doing): the binding stays.
    assert run(f, "r3", [a, b], picked="A") == ["B"]
    assert f.bound_endpoint("s1") == "B"
    # B absent: all pass, and the session moves to the endpoint picked.
    assert run(f, "r4", [a, c], picked="C") == ["A", "C"]
    assert f.bound_endpoint("s1") == "C"
    assert run(f, "r5", [a, b, c]) == ["C"]


def test_no_move_without_this_requests_own_filter_note() -> None:
    f = session_filter_with(FakeClock())
    request = make_request(request_id="r1", headers={"x-session-id": "s1"})
    f.pre_request(request, decided(("decode", "A")), CycleState())
    f.pre_request(request, decided(("decode", "B")), CycleState())  # the filter did not run: no note
    assert f.bound_endpoint("s1") == "A"


def test_no_session_id_and_no_candidates_pass_through() -> None:
    f = session_filter_with(FakeClock())
    a = make_endpoint("A")
    state = CycleState()
    assert names(f.filter(make_request(), state, [a])) == ["A"]
    assert list(f.filter(make_request(headers={"x-session-id": "s1"}), state, [])) == []
    f.pre_request(make_request(), decided(("decode", "A")), state)
    assert f._bindings == {}


def test_bindings_expire_after_the_ttl_at_the_next_sweep() -> None:
    clock = FakeClock()
    f = session_filter_with(clock, eviction_ttl_seconds=30, eviction_sweep_seconds=10)
    a, b = make_endpoint("A"), make_endpoint("B")
    run(f, "r1", [a, b], picked="B")  # bound at t=0 (1000)
    clock.now += 30  # a sweep: unused for 30 s, not more than the TTL
    assert run(f, "r2", [a, b]) == ["B"]  # and PreRequest refreshes it at t=30
    clock.now += 31  # unused for 31 s, and a sweep is due
    state = CycleState()
    assert names(f.filter(make_request(headers={"x-session-id": "s1"}), state, [a, b])) == ["A", "B"]
    assert f.bound_endpoint("s1") is None


def test_an_expired_binding_serves_until_the_sweep() -> None:
    clock = FakeClock()
    f = session_filter_with(clock, eviction_ttl_seconds=30, eviction_sweep_seconds=10)
    a, b = make_endpoint("A"), make_endpoint("B")
    clock.now += 5
    run(f, "r1", [a, b], picked="B")  # bound at 1005; last sweep at 1000 (construction)
    clock.now = 1030  # sweep at 1030: 25 s unused
    f.filter(make_request(), CycleState(), [a])
    clock.now = 1036  # 31 s unused, but the next sweep is due at 1040
    assert f.bound_endpoint("s1") == "B"
    assert names(f.filter(make_request(headers={"x-session-id": "s1"}), CycleState(), [a, b])) == ["B"]
    clock.now = 1040
    assert names(f.filter(make_request(headers={"x-session-id": "s1"}), CycleState(), [a, b])) == ["A", "B"]


def test_sources_in_order_and_an_attribute_from_the_producer() -> None:
    loaded = load(
        [
            {"type": "session-id-producer", "parameters": {"cookieName": "llm-d-session"}},
            {
                "name": "sa",
                "type": "session-affinity-filter",
                "parameters": {
                    "strategy": "session_id",
                    "sessionIdConfig": {
                        "sources": [
                            {"header": "X-Conversation"},
                            {"attribute": "SessionIDDataKey", "producer": "session-id-producer"},
                        ]
                    },
                },
            },
        ]
    )
    producer = loaded.plugins["session-id-producer"]
    f = loaded.plugins["sa"]
    assert isinstance(producer, SessionIdProducer) and isinstance(f, SessionAffinityFilter)
    request = make_request(headers={"cookie": "llm-d-session=abc", "x-conversation": "  "})
    state = CycleState()
    assert f.session_id(request, state) == ""  # the producer has not run
    producer.produce(request, state, [])
    assert f.session_id(request, state) == "abc"  # the blank header is skipped
    both = make_request(headers={"cookie": "llm-d-session=abc", "x-conversation": "conv-9"})
    assert f.session_id(both, state) == "conv-9"
    # A source without a producer reads "<attribute>/".
    solo = SessionAffinityFilter(
        params=SessionAffinityParameters(
            strategy="session_id",
            session_id_config=SessionIdConfig(sources=(SessionIdSource(attribute="agent-identity"),)),
        )
    )
    state.write("agent-identity/", "agent-7")
    assert solo.session_id(make_request(), state) == "agent-7"


def test_session_id_pins_the_profile_named() -> None:
    params = SessionAffinityParameters(strategy="session_id", profile_name="prefill")
    f = SessionAffinityFilter("sa", params, clock=FakeClock())
    request = make_request(request_id="r1", headers={"x-session-id": "s1"})
    f.pre_request(request, decided(("decode", "D"), ("prefill", "P")), CycleState())
    assert f.bound_endpoint("s1") == "P"
    response = Response("r1")
    f.response_received(request, response, make_endpoint("D"))
    assert response.add_headers == {}  # session_id writes nothing to the client


def test_session_id_defaults() -> None:
    f = make(
        "session-affinity-filter", {"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": 0}}
    )
    assert (f.ttl, f.sweep) == (300.0, 10.0)
    assert [(s.kind, s.key) for s in f.sources] == [("header", "x-session-id")]


# --- session-affinity-filter: parameters --------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "path", "message"),
    [
        ({"strategy": "sticky"}, "strategy", 'strategy must be "encoded_endpoint_header" or "session_id"'),
        ({"strategy": ""}, "strategy", 'got ""'),
        (
            {"strategy": "session_id", "sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]}},
            "sessionIdConfig.sources[0]",
            "sources[0]: exactly one of header or attribute must be set",
        ),
        (
            {"strategy": "session_id", "sessionIdConfig": {"sources": [{"header": "a"}, {"producer": "p"}]}},
            "sessionIdConfig.sources[1]",
            "sources[1]: exactly one of header or attribute must be set",
        ),
        (
            {"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": -1}},
            "sessionIdConfig.evictionTtlSeconds",
            "evictionTtlSeconds must be > 0, got -1",
        ),
        (
            {"strategy": "session_id", "sessionIdConfig": {"evictionSweepSeconds": -0.5}},
            "sessionIdConfig.evictionSweepSeconds",
            "evictionSweepSeconds must be > 0, got -0.5",
        ),
        (
            {"strategy": "session_id", "sessionIdConfig": {"evictionTTLSeconds": 5}},
            "sessionIdConfig.evictionTTLSeconds",
            "unknown field",
        ),
    ],
)
def test_filter_parameter_errors(parameters: dict[str, Any], path: str, message: str) -> None:
    [(where, text)] = issues("session-affinity-filter", parameters)
    assert where == f"{PATH}.{path}"
    assert message in text


def test_only_the_selected_strategys_block_is_checked() -> None:
    f = make(
        "session-affinity-filter",
        {"sessionIdConfig": {"evictionTtlSeconds": -1, "sources": [{}]}},
    )
    assert f.strategy == "encoded_endpoint_header"


def test_direct_construction_checks_too() -> None:
    with pytest.raises(ParameterError):
        SessionAffinityFilter(params=SessionAffinityParameters(strategy="nope"))


# --- utilization-filter -------------------------------------------------------------------------


def test_spec_example_caps_are_inclusive() -> None:
    f = make(
        "utilization-filter",
        {
            "conditions": [
                {"metric": "running-requests", "maxValue": 40},
                {"metric": "kv-cache-utilization", "maxValue": 0.8},
            ]
        },
    )
    over = make_endpoint("over", running=35, kv=0.85)
    at = make_endpoint("at", running=40, kv=0.8)
    busy = make_endpoint("busy", running=41, kv=0.1)
    assert names(f.filter(make_request(), CycleState(), [over, at, busy])) == ["at"]


def test_empty_result_and_fallback() -> None:
    conditions = [{"metric": "waiting-queue", "maxValue": 0}]
    queued = [make_endpoint("a", queue=1), make_endpoint("b", queue=3)]
    strict = make("utilization-filter", {"conditions": conditions})
    assert list(strict.filter(make_request(), CycleState(), queued)) == []
    lenient = make("utilization-filter", {"conditions": conditions, "fallbackOnEmpty": True})
    assert names(lenient.filter(make_request(), CycleState(), queued)) == ["a", "b"]
    assert names(lenient.filter(make_request(), CycleState(), [*queued, make_endpoint("c")])) == ["c"]


def test_active_requests_read_the_inflight_producer_added_by_default() -> None:
    loaded = load(
        [
            {
                "name": "u",
                "type": "utilization-filter",
                "parameters": {"conditions": [{"metric": "active-requests", "maxValue": 1}]},
            }
        ]
    )
    producer = loaded.plugins["inflight-load-producer"]
    f = loaded.plugins["u"]
    assert isinstance(producer, InFlightLoadProducer) and isinstance(f, UtilizationFilter)
    assert f.inflight is producer
    assert any("inflight-load-producer" in w for w in loaded.warnings)
    for rid in ("r1", "r2"):
        producer.pre_request(make_request(request_id=rid), decided(("decode", "A")), CycleState())
    producer.pre_request(make_request(request_id="r3"), decided(("decode", "B")), CycleState())
    a, b, c = make_endpoint("A"), make_endpoint("B"), make_endpoint("C")
    assert names(f.filter(make_request(), CycleState(), [a, b, c])) == ["B", "C"]  # A has 2 > 1


def test_no_producer_without_active_requests() -> None:
    loaded = load(
        [
            {
                "name": "u",
                "type": "utilization-filter",
                "parameters": {
                    "conditions": [{"metric": "running-requests", "maxValue": 4}],
                    "inFlightLoadProducerName": "nowhere",  # read only for active-requests
                },
            }
        ]
    )
    assert "inflight-load-producer" not in loaded.plugins
    f = loaded.plugins["u"]
    assert isinstance(f, UtilizationFilter) and f.inflight is None


@pytest.mark.parametrize(
    ("parameters", "path", "message"),
    [
        (None, "conditions", "utilization filter requires at least one condition"),
        ({"conditions": []}, "conditions", "utilization filter requires at least one condition"),
        (
            {"conditions": [{"metric": "gpu", "maxValue": 1}]},
            "conditions[0].metric",
            'must be one of "active-requests", "running-requests", "waiting-queue", '
            '"kv-cache-utilization", got "gpu"',
        ),
        (
            {"conditions": [{"metric": "waiting-queue", "maxValue": 1}, {"metric": "running-requests"}]},
            "conditions[1].maxValue",
            'condition for "running-requests" requires maxValue',
        ),
        (
            {"conditions": [{"metric": "running-requests", "maxValue": -1}]},
            "conditions[0].maxValue",
            "requires a non-negative maxValue, got -1",
        ),
        (
            {"conditions": [{"metric": "kv-cache-utilization", "maxValue": 1.5}]},
            "conditions[0].maxValue",
            "is a fraction and must be at most 1, got 1.5",
        ),
        (
            {"conditions": [{"metric": "running-requests", "maxValue": float("nan")}]},
            "conditions[0].maxValue",
            "requires a non-negative maxValue",
        ),
        (
            {"conditions": [{"metric": "active-requests", "maxValue": 3}], "inFlightLoadProducerName": "x"},
            "inFlightLoadProducerName",
            "no in-flight load producer named 'x'",
        ),
        (
            {"conditions": [{"metric": "running-requests", "max": 3}]},
            "conditions[0].max",
            "unknown field",
        ),
    ],
)
def test_utilization_parameter_errors(parameters: dict[str, Any] | None, path: str, message: str) -> None:
    [(where, text)] = issues("utilization-filter", parameters)
    assert where == f"{PATH}.{path}"
    assert message in text


def test_cookie_session_end_to_end_through_the_request_path() -> None:
    loaded = load(
        [
            {"type": "session-id-producer", "parameters": {"cookieName": "llm-d-session"}},
            {
                "type": "session-affinity-filter",
                "parameters": {
                    "strategy": "session_id",
                    "sessionIdConfig": {
                        "sources": [{"attribute": "SessionIDDataKey", "producer": "session-id-producer"}]
                    },
                },
            },
            {"type": "random-picker"},
        ]
    )
    path = RequestPath(loaded)
    pool = [make_endpoint(f"ep-{i}") for i in range(8)]
    cookie = {"cookie": "theme=dark; llm-d-session=abc"}
    first = path.decide(make_request(request_id="r0", headers=cookie), pool).targets[0].name
    for i in range(1, 10):
        again = path.decide(make_request(request_id=f"r{i}", headers=cookie), pool)
        assert again.targets[0].name == first
    # Its endpoint gone, the session moves, and stays on the new one.
    rest = [ep for ep in pool if ep.name != first]
    moved = path.decide(make_request(request_id="m0", headers=cookie), rest).targets[0].name
    assert moved != first
    assert path.decide(make_request(request_id="m1", headers=cookie), pool).targets[0].name == moved


def test_profile_targets_never_answered_are_forgotten() -> None:
    clock = FakeClock()
    f = SessionAffinityFilter("sa", SessionAffinityParameters(profile_name="prefill"), clock=clock)
    f.pre_request(make_request(request_id="r1"), decided(("decode", "D"), ("prefill", "P")), CycleState())
    assert set(f._pending) == {"r1"}
    clock.now += 301
    f.pre_request(make_request(request_id="r2"), decided(("decode", "D"), ("prefill", "P")), CycleState())
    assert set(f._pending) == {"r2"}
