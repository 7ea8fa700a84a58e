"""The director: parse, admit, schedule, hooks. No network: a datastore with metrics set by hand."""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import pytest

from epick.config import LoadedConfig, load_config_file, load_config_text, load_default_config
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.rewrites import ModelRewrites, parse_rewrite
from epick.datalayer.traffic import Traffic
from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    NamedPlugin,
    Response,
    SchedulingResult,
)
from epick.plugins.prefix.scorer import PrefixCacheScorer
from epick.requestcontrol.director import (
    DESTINATION_HEADER,
    FAIRNESS_HEADER,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    PREFILL_HEADER,
    Director,
    Observer,
    ResponseNeeds,
)
from epick.requestcontrol.errors import RequestError

SEED = 7


def make_store(*queues: int, kv: float = 0.0, update_time: float | None = None) -> Datastore:
    """Endpoints ep0, ep1, ... with the given waiting-queue lengths."""
    ds = Datastore()
    for i, queue in enumerate(queues):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i + 1}", 8000, {"gpu": "h100"}))
        ds.update_metrics(
            f"ep{i}", Metrics(waiting_queue_size=queue, kv_cache_usage_percent=kv, update_time=update_time)
        )
    return ds


def body(**fields: Any) -> bytes:
    raw: dict[str, Any] = {"model": "m", "prompt": "hello there", **fields}
    return json.dumps({k: v for k, v in raw.items() if v is not ...}).encode()


def director(ds: Datastore | None = None, config: LoadedConfig | None = None, **kw: Any) -> Director:
    store = ds if ds is not None else make_store(0, 0)
    d = Director(config or load_default_config(seed=SEED), store.snapshot, **kw)
    store.subscribe(d.endpoint_changed)
    return d


def refused(d: Director, payload: bytes, headers: dict[str, str] | None = None) -> RequestError:
    with pytest.raises(RequestError) as e:
        d.decide(payload, headers or {}, "/v1/completions")
    return e.value


# Parsing: 400 and 413.


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"not json", "request body is not valid JSON"),
        (b"", "request body is not valid JSON"),
        (b"\xff\xfe\x00garbage", "request body is not valid JSON"),
        (b'{"model": "m", "prompt": "x"', "request body is not valid JSON"),
        (b"[1, 2, 3]", "request body must be a JSON object"),
        (b'"just a string"', "request body must be a JSON object"),
        (b"null", "request body must be a JSON object"),
        (b'{"prompt": "hello"}', "request body has no 'model'"),
        (b'{"model": "", "prompt": "hello"}', "request body has no 'model'"),
        (b'{"model": 3, "prompt": "hello"}', "request body has no 'model'"),
        (body(prompt=5), "completion request needs 'prompt'"),
        (body(prompt=...), "completion request needs 'prompt'"),
        (body(prompt=[]), "completion request needs 'prompt'"),
        (body(prompt=[1, "a"]), "completion request needs 'prompt'"),
        (body(stream="yes"), "'stream' must be a boolean"),
        (body(max_tokens=-1), "'max_tokens' must be a non-negative integer"),
    ],
)
def test_bad_bodies_are_400(payload: bytes, message: str) -> None:
    e = refused(director(), payload)
    assert (e.status, e.code) == (400, "bad_request")
    assert message in e.message
    err = json.loads(e.body())["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "bad_request"
    assert message in err["message"]


def test_bad_chat_messages_are_400() -> None:
    d = director()
    for messages, message in [
        (None, "chat request needs 'messages'"),
        ([], "chat request needs 'messages'"),
        ([{"content": "hi"}], "messages[0] must be an object with a string 'role'"),
        ([{"role": "user", "content": 5}], "messages[0].content must be a string"),
    ]:
        payload = json.dumps({"model": "m", "messages": messages}).encode()
        with pytest.raises(RequestError) as e:
            d.decide(payload, {}, "/v1/chat/completions")
        assert e.value.status == 400 and message in e.value.message


def test_oversized_body_is_413() -> None:
    d = director(max_body_bytes=100)
    ok = body(prompt="x" * 50)
    assert len(ok) <= 100
    d.decide(ok, {}, "/v1/completions")
    big = body(prompt="x" * 200)
    e = refused(d, big)
    assert (e.status, e.code) == (413, "body_too_large")
    assert f"request body of {len(big)} bytes exceeds the limit of 100 bytes" in e.message
    # Even a body that is not JSON: the size is checked first.
    assert refused(d, b"x" * 101).status == 413


def test_the_path_says_what_the_body_is() -> None:
    d = director()
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    assert d.decide(chat, {}, "/v1/chat/completions").request.body.kind == "chat"
    assert d.decide(chat, {}, "/v1/chat/completions?x=1").request.body.kind == "chat"
    assert d.decide(body(), {}).request.body.kind == "completion"  # no path: upstream's /v1/completions
    # A chat body sent to the completions path is read as completions: it has no prompt.
    with pytest.raises(RequestError, match="completion request needs 'prompt'"):
        d.decide(chat, {}, "/v1/completions")


# Headers.


def rewrites(*rules: tuple[list[str], list[tuple[str, int]]], seed: int = 0) -> ModelRewrites:
    """One InferenceModelRewrite of these rules: (models matched, [(target model, weight)])."""
    resource = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": "r"},
        "spec": {
            "poolRef": {"name": "pool"},
            "rules": [
                {
                    "matches": [{"model": {"value": m}} for m in models],
                    "targets": [{"modelRewrite": t, "weight": w} for t, w in targets],
                }
                for models, targets in rules
            ],
        },
    }
    return ModelRewrites((parse_rewrite(resource),), random.Random(seed))


def test_a_configured_rewrite_rewrites_the_forwarded_body() -> None:
    d = director(rewrites=rewrites((["alias"], [("meta-llama/Llama-3.1-8B", 1)])))
    original = body(model="alias", max_tokens=12, stream=True, temperature=0.5, user="u1")
    decision = d.decide(original, {}, "/v1/completions")
    assert decision.request.target_model == "meta-llama/Llama-3.1-8B" and decision.client_model == "alias"
    forwarded = json.loads(decision.body)
    assert forwarded == {**json.loads(original), "model": "meta-llama/Llama-3.1-8B"}
    assert decision.request.body.stream and decision.request.body.max_tokens == 12
    assert decision.request.size == len(decision.body)
    # A model no rule names goes through untouched, bytes and all.
    other = body(model="m")
    assert d.decide(other, {}, "/v1/completions").body is other


def test_a_clients_rewrite_header_is_ignored_and_hidden_from_plugins() -> None:
    d = director()
    original = body(model="m")
    headers = {
        MODEL_REWRITE_HEADER: "gpt-4",
        PREFILL_HEADER: "10.9.9.9:80",
        DESTINATION_HEADER: "10.9.9.9:80",
    }
    decision = d.decide(original, headers, "/v1/completions")
    assert decision.body is original and decision.request.target_model == "m"
    assert not set(decision.request.headers) & {MODEL_REWRITE_HEADER, PREFILL_HEADER, DESTINATION_HEADER}


def test_a_weighted_split_follows_its_weights() -> None:
    d = director(rewrites=rewrites((["llama"], [("v1", 3), ("v2", 1)]), seed=4))
    sent = [d.decide(body(model="llama"), {}, "/v1/completions").request.target_model for _ in range(400)]
    assert set(sent) == {"v1", "v2"}
    assert 0.68 < sent.count("v1") / len(sent) < 0.82  # 3:1, and 400 draws


def test_client_destination_header_is_dropped() -> None:
    d = director()
    headers = {
        "X-Gateway-Destination-Endpoint": "10.9.9.9:8000",
        "X-Request-Id": "req-1",
        "Authorization": "Bearer t",
        FAIRNESS_HEADER: "tenant-a",
    }
    decision = d.decide(body(), headers, "/v1/completions")
    assert DESTINATION_HEADER not in decision.request.headers
    assert decision.request.request_id == "req-1"
    assert decision.request.headers["authorization"] == "Bearer t"
    assert decision.request.headers[FAIRNESS_HEADER] == "tenant-a"
    assert decision.targets[0].host_port != "10.9.9.9:8000"


def test_request_id_is_generated_when_absent() -> None:
    d = director()
    a = d.decide(body(), {}, "/v1/completions").request.request_id
    b = d.decide(body(), {}, "/v1/completions").request.request_id
    assert a and b and a != b


# No endpoints, filtered, shed.


def test_no_endpoints_is_503() -> None:
    e = refused(director(Datastore()), body())
    assert (e.status, e.code) == (503, "no_endpoints")
    assert json.loads(e.body())["error"]["type"] == "service_unavailable"


def test_all_unhealthy_is_503() -> None:
    ds = make_store(0, 0)
    ds.set_healthy("ep0", False)
    d = director(ds)
    assert d.decide(body(), {}, "/v1/completions").targets[0].name == "ep1"
    ds.set_healthy("ep1", False)
    assert refused(d, body()).status == 503
    ds.set_healthy("ep0", True)
    assert d.decide(body(), {}, "/v1/completions").targets[0].name == "ep0"


FILTER_NOTHING = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: label-selector-filter
  parameters: {matchLabels: {gpu: b200}}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: label-selector-filter
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""


def test_every_endpoint_filtered_is_429() -> None:
    d = director(make_store(0, 0, 0), load_config_text(FILTER_NOTHING, seed=SEED))
    e = refused(d, body())
    assert (e.status, e.code) == (429, "shed")
    assert "label-selector-filter" in e.message and "removed all 3 endpoints" in e.message
    assert json.loads(e.body())["error"]["type"] == "rate_limit_error"


OBJECTIVES = {"batch": -1, "interactive": 0, "critical": 10}


@pytest.mark.parametrize("queues", [(5, 5, 5), (9, 5, 7), (5, 30, 6)])
def test_sheddable_request_is_shed_when_the_pool_is_saturated(queues: tuple[int, ...]) -> None:
    d = director(make_store(*queues), objectives=OBJECTIVES)
    e = refused(d, body(), {OBJECTIVE_HEADER: "batch"})
    assert (e.status, e.code) == (429, "shed")
    assert "pool saturated" in e.message and "priority -1" in e.message
    # Priority >= 0 is never shed, and neither is a request without an objective.
    for headers in ({OBJECTIVE_HEADER: "interactive"}, {OBJECTIVE_HEADER: "critical"}, {}):
        assert d.decide(body(), headers, "/v1/completions").targets


@pytest.mark.parametrize("queues", [(4, 4, 4), (5, 5, 4), (0, 0, 0)])
def test_sheddable_request_is_served_when_the_pool_is_not_saturated(queues: tuple[int, ...]) -> None:
    d = director(make_store(*queues), objectives=OBJECTIVES)
    decision = d.decide(body(), {"X-Gateway-Inference-Objective": "batch"}, "/v1/completions")
    assert decision.request.priority == -1 and decision.request.objective == "batch"
    assert decision.targets


def test_kv_saturation_and_stale_metrics_shed_too() -> None:
    full = director(make_store(0, 0, kv=0.8, update_time=time.time()), objectives=OBJECTIVES)
    assert refused(full, body(), {OBJECTIVE_HEADER: "batch"}).status == 429
    stale = director(make_store(0, 0, update_time=time.time() - 60), objectives=OBJECTIVES)
    assert refused(stale, body(), {OBJECTIVE_HEADER: "batch"}).status == 429
    fresh = director(make_store(0, 0, update_time=time.time()), objectives=OBJECTIVES)
    assert fresh.decide(body(), {OBJECTIVE_HEADER: "batch"}, "/v1/completions").targets


def test_unknown_objective_has_priority_zero() -> None:
    d = director(make_store(9, 9), objectives=OBJECTIVES)
    decision = d.decide(body(), {OBJECTIVE_HEADER: "nobody-defined-this"}, "/v1/completions")
    assert decision.request.priority == 0


# Models.


def test_unknown_model_is_404_when_models_are_known() -> None:
    served = {"m", "sql-lora"}
    d = director(known_models=lambda: served)
    e = refused(d, body(model="gpt-4"))
    assert (e.status, e.code) == (404, "model_not_found")
    assert "'gpt-4' is not served by any endpoint (served: m, sql-lora)" in e.message
    assert json.loads(e.body())["error"]["type"] == "not_found_error"
    assert d.decide(body(model="sql-lora"), {}, "/v1/completions").request.target_model == "sql-lora"
    # The model checked is the one after a rewrite.
    d.rewrites = rewrites((["gpt-4"], [("m", 1)]), (["m"], [("gpt-5", 1)]))
    assert d.decide(body(model="gpt-4"), {}, "/v1/completions").targets
    assert refused(d, body(model="m")).status == 404


def test_model_check_is_skipped_while_no_model_is_known() -> None:
    d = director(known_models=set)
    assert d.decide(body(model="anything"), {}, "/v1/completions").targets


# Hooks.


LONG_PROMPT = "You are a helpful assistant. Answer the question below in detail. " * 12


def test_pre_request_hooks_teach_the_prefix_index() -> None:
    config = load_default_config(seed=SEED)
    d = director(make_store(0, 0, 0), config)
    [prefix] = [p for p in config.plugins.values() if isinstance(p, PrefixCacheScorer)]
    first = d.decide(body(prompt=LONG_PROMPT), {}, "/v1/completions")
    chosen = first.targets[0]
    assert len(prefix.index) > 0

    second = InferenceRequest.from_openai({"model": "m", "prompt": LONG_PROMPT})
    endpoints = d.candidates()
    scores = prefix.score(second, CycleState(), endpoints)
    assert scores == [1.0 if ep.name == chosen.name else 0.0 for ep in endpoints]
    # And the scheduler follows the cache: the same prompt goes to the same endpoint.
    for _ in range(5):
        assert d.decide(body(prompt=LONG_PROMPT), {}, "/v1/completions").targets[0].name == chosen.name
    # Another model's prompt shares nothing.
    other = InferenceRequest.from_openai({"model": "other", "prompt": LONG_PROMPT})
    assert prefix.score(other, CycleState(), endpoints) == [0.0, 0.0, 0.0]


class Recorder(NamedPlugin):
    plugin_type = "recorder"

    def __init__(self, name: str, log: list[tuple[str, str]], fail: bool = False) -> None:
        super().__init__(name)
        self.log = log
        self.fail = fail

    def _record(self, what: str) -> None:
        self.log.append((self.name, what))
        if self.fail:
            raise RuntimeError(f"{self.name} broke in {what}")

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        self._record("pre_request")

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self._record("received")

    def response_streaming(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self._record("streaming")

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self._record("complete")


def with_hooks(config: LoadedConfig, *hooks: Recorder) -> LoadedConfig:
    for hook in hooks:
        config.hooks.pre_request.append(hook)
        config.hooks.response_received.append(hook)
        config.hooks.response_streaming.append(hook)
        config.hooks.response_complete.append(hook)
    return config


def test_response_hooks_run_in_order() -> None:
    log: list[tuple[str, str]] = []
    d = director(config=with_hooks(load_default_config(seed=SEED), Recorder("a", log), Recorder("b", log)))
    decision = d.decide(body(), {}, "/v1/completions")
    assert log == [("a", "pre_request"), ("b", "pre_request")]
    log.clear()
    response = Response(decision.request.request_id, streaming=True)
    endpoint = decision.targets[0]
    decision.received(response, endpoint)
    decision.streamed(response, endpoint)
    decision.streamed(response, endpoint)
    decision.completed(response, endpoint)
    assert log == [
        ("a", "received"),
        ("b", "received"),
        ("a", "streaming"),
        ("b", "streaming"),
        ("a", "streaming"),
        ("b", "streaming"),
        ("a", "complete"),
        ("b", "complete"),
    ]


def test_a_hook_that_raises_is_logged_not_propagated(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="epick.requestcontrol.director")
    log: list[tuple[str, str]] = []
    config = with_hooks(
        load_default_config(seed=SEED), Recorder("bad", log, fail=True), Recorder("good", log)
    )
    d = director(config=config)
    decision = d.decide(body(), {}, "/v1/completions")  # no exception
    response = Response(decision.request.request_id)
    decision.received(response, decision.targets[0])
    decision.streamed(response, decision.targets[0])
    decision.completed(response, decision.targets[0])
    # The good hook after the bad one still ran every time.
    assert [what for name, what in log if name == "good"] == [
        "pre_request",
        "received",
        "streaming",
        "complete",
    ]
    failures = [r for r in caplog.records if "request-control hook" in r.getMessage()]
    assert len(failures) == 4
    assert all("bad/recorder" in r.getMessage() and r.exc_info is not None for r in failures)
    assert "bad broke in pre_request" in str(failures[0].exc_info[1])  # type: ignore[index]


# Config swap.


def test_replace_config() -> None:
    d = director(make_store(0, 0, 0))
    d.decide(body(), {}, "/v1/completions")
    d.replace_config(load_config_text(FILTER_NOTHING, seed=SEED))
    assert refused(d, body()).status == 429


def test_an_endpoint_that_leaves_is_forgotten_by_the_prefix_index() -> None:
    store = make_store(0, 0)
    d = director(store)
    prefix = next(p for p in d.config.plugins.values() if isinstance(p, PrefixCacheScorer))
    chosen = d.decide(body(prompt="a long shared system prompt " * 20), {}, "/v1/completions").targets[0].name
    assert chosen in prefix.index.endpoints()
    store.remove(chosen)
    assert chosen not in prefix.index.endpoints()
    # The next decision runs on the endpoint that is left, with no stale match.
    assert (
        d.decide(body(prompt="a long shared system prompt " * 20), {}, "/v1/completions").targets[0].name
        != chosen
    )


class UsageObserver(Observer):
    reads_usage = True


def test_a_response_is_read_for_its_usage_only_when_something_wants_it() -> None:
    assert director().decide(body(), {}).usage is None  # no hook reads responses, no metrics
    assert director(observer=UsageObserver()).decide(body(), {}).usage is not None
    hooked = load_config_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: inflight-load-producer\n- type: queue-scorer\n",
        seed=SEED,
    )
    d = director(config=hooked)  # a ResponseComplete hook: it may read the usage
    assert d.config.hooks.response_complete
    assert d.response_needs is ResponseNeeds.BODY
    assert d.decide(body(), {}).usage is not None


def test_the_shared_state_is_brought_up_to_date_before_every_scheduling() -> None:
    """`before_schedule` (the workers' catch-up) runs before each decision, a retry's included."""
    d = director(make_store(0, 0))
    calls: list[int] = []
    d.before_schedule = lambda: calls.append(len(calls))
    decision = d.decide(body(), {}, "/v1/completions")
    assert calls == [0]
    decision.reschedule(frozenset({decision.targets[0].name}))
    assert calls == [0, 1]


def test_the_traffic_hears_of_every_endpoint_a_request_goes_to() -> None:
    """Quiet scraping's bookkeeping: the decode target and the prefill endpoint as decided, another
    target the proxy tries after a failure (once, however often it is told), all released at the end."""
    ds = Datastore()
    for i, role in enumerate(("prefill", "decode", "decode")):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i + 1}", 8000, {"llm-d.ai/role": role}))
        ds.update_metrics(f"ep{i}", Metrics(update_time=time.time()))
    pd = load_config_file(str(Path(__file__).parents[2] / "config" / "pd.yaml"))
    d = director(ds, pd)
    d.traffic = traffic = Traffic()
    cycle = d.begin(json.dumps({"model": "m", "prompt": "p " * 600}).encode(), {}, "/v1/completions")
    result = cycle.decide()
    assert result.prefill is not None and result.prefill.name == "ep0"
    target = result.targets[0].name
    other = next(ep for ep in ds.snapshot() if ep.name not in ("ep0", target))
    assert traffic.in_flight("ep0") == 1 and traffic.in_flight(target) == 1
    assert traffic.in_flight(other.name) == 0
    cycle.dispatching(other)  # the proxy moves on to it
    cycle.dispatching(other)
    assert traffic.in_flight(other.name) == 1
    cycle.completed(Response(cycle.request.request_id, status=200), other)
    cycle.completed(Response(cycle.request.request_id, status=200), other)  # a second report is ignored
    assert [traffic.in_flight(n) for n in ("ep0", "ep1", "ep2")] == [0, 0, 0]
