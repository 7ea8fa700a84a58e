"""`selective-kv-policy`: upstream's rules (llm-d-router selectivekv, plugin.go at e872cb8d, README at
248dbdf5) worked by hand: validation, the external-reusable-token threshold, the waiting-queue gate,
the `kv_transfer_params` edits, and the plugin loaded through a config and run on the request path."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from typing import Any

import pytest

from epick.config import ConfigError, LoadedConfig, load_config_text
from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileRunResult,
    RequestBody,
    SchedulingResult,
)
from epick.framework.datalayer import data_key
from epick.plugins import in_tree_registry
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch
from epick.plugins.prerequest.selective_kv import (
    BODY_MUTATED_KEY,
    SPEC,
    SelectiveKVParameters,
    SelectiveKVPolicy,
    external_reusable_tokens,
    mutate_kv_transfer_params,
)
from epick.plugins.registry import ParameterError, Registry
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
PRECISE = "precise-prefix-cache-producer"
BLOCK_TOKENS = 16
KTP = "kv_transfer_params"
THRESHOLD: dict[str, Any] = {"load_policy": "threshold"}
NEEDS_THRESHOLD = "requires threshold"


def registry() -> Registry:
    r = in_tree_registry()
    if SPEC.type not in r:
        r.register(SPEC)
    return r


def load(body: str) -> LoadedConfig:
    return load_config_text(HEADER + textwrap.dedent(body), seed=0, registry=registry(), source="t.yaml")


def policy(**params: Any) -> SelectiveKVPolicy:
    return SelectiveKVPolicy(params=SelectiveKVParameters(**params))


def threshold(minimum: int = 48, waiting: int = 0) -> SelectiveKVPolicy:
    return policy(load_policy="threshold", min_external_reusable_tokens=minimum, max_waiting_requests=waiting)


def with_tiers(tiers: Mapping[str, Mapping[str, int]] | None, producer: str = PRECISE) -> CycleState:
    """A cycle state holding a prefix match whose per-tier runs are `tiers` by endpoint (None: a
    producer without tier data)."""

    def by_tier(endpoint: str) -> Mapping[str, int]:
        assert tiers is not None
        return tiers.get(endpoint, {})

    match = PrefixMatch(8, BLOCK_TOKENS * 4, {}, tiers=None if tiers is None else by_tier)
    state = CycleState()
    state.write(data_key(MATCH_DATA_TYPE, producer), match)
    return state


def on(endpoint: Endpoint | str, primary: str = "decode", **others: Endpoint) -> SchedulingResult:
    target = make_endpoint(endpoint) if isinstance(endpoint, str) else endpoint
    results = {primary: ProfileRunResult((target,))}
    results.update({name: ProfileRunResult((ep,)) for name, ep in others.items()})
    return SchedulingResult(results, primary)


def chat(**fields: Any) -> InferenceRequest:
    return make_request(messages=[{"role": "user", "content": "hi"}], **fields)


def raw(request: InferenceRequest) -> Mapping[str, Any]:
    assert request.body.raw is not None
    return request.body.raw


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({}, "loadPolicy", "at least one of loadPolicy or offloadPolicy"),
        ({"load_policy": "threshold"}, "minExternalReusableTokens", "greater than zero"),
        (
            {"load_policy": "threshold", "min_external_reusable_tokens": -5},
            "minExternalReusableTokens",
            "zero",
        ),
        ({"load_policy": "disable", "max_waiting_requests": -1}, "maxWaitingRequests", "negative"),
        ({"load_policy": "disable", "max_waiting_requests": 8}, "maxWaitingRequests", NEEDS_THRESHOLD),
        (
            {"offload_policy": "disable", "max_waiting_requests": 8},
            "maxWaitingRequests",
            "requires threshold",
        ),
    ],
)
def test_upstreams_validation(params: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ParameterError) as e:
        SelectiveKVPolicy(params=SelectiveKVParameters(**params))
    assert e.value.parameter == field
    assert words in str(e.value)


def test_accepted_combinations() -> None:
    assert policy(load_policy="disable").offload_policy == "preserve"
    assert policy(offload_policy="disable").load_policy == "preserve"
    assert threshold(1024, 8).max_waiting == 8
    assert threshold(1).min_external == 1


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        ("{}", "loadPolicy", "at least one"),
        ("{loadPolicy: sometimes}", "loadPolicy", ""),
        ("{offloadPolicy: threshold}", "offloadPolicy", ""),
        ("{loadPolicy: threshold}", "minExternalReusableTokens", "greater than zero"),
        ("{loadPolicy: disable, maxWaitingRequests: 3}", "maxWaitingRequests", "requires threshold"),
        ("{loadPolicy: disable, bogus: 1}", "bogus", ""),
        (
            "{loadPolicy: threshold, minExternalReusableTokens: 1024}",  # no precise producer in the config
            "prefixMatchInfoProducerName",
            "precise-prefix-cache-producer",
        ),
        (
            "{loadPolicy: threshold, minExternalReusableTokens: 1,"
            " prefixMatchInfoProducerName: random-picker}",
            "prefixMatchInfoProducerName",
            "does not produce",
        ),
    ],
)
def test_parameter_errors_through_a_config(parameters: str, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(f"plugins:\n- type: selective-kv-policy\n  parameters: {parameters}\n- type: random-picker\n")
    assert any(path in i.path or path in i.message for i in e.value.issues), e.value
    assert words in str(e.value)


def test_parameters_are_required() -> None:
    with pytest.raises(ConfigError) as e:
        load("plugins:\n- type: selective-kv-policy\n- type: random-picker\n")
    assert "at least one of loadPolicy or offloadPolicy" in str(e.value)


def test_threshold_reads_the_precise_producer_of_the_config() -> None:
    config = load(
        """\
        plugins:
        - type: precise-prefix-cache-producer
        - type: selective-kv-policy
          parameters: {loadPolicy: threshold, minExternalReusableTokens: 1024, maxWaitingRequests: 8}
        - type: random-picker
        """
    )
    p = config.plugins["selective-kv-policy"]
    assert isinstance(p, SelectiveKVPolicy)
    assert p.match_key == "PrefixCacheMatchInfoDataKey/precise-prefix-cache-producer"
    assert p in config.hooks.pre_request
    assert "waiting-queue" in config.worker_states["selective-kv-policy"]


def test_an_empty_producer_name_reads_the_approximate_producers_key_and_adds_one() -> None:
    config = load(
        """\
        plugins:
        - type: selective-kv-policy
          parameters: {loadPolicy: threshold, minExternalReusableTokens: 1, prefixMatchInfoProducerName: ""}
        - type: random-picker
        """
    )
    p = config.plugins["selective-kv-policy"]
    assert isinstance(p, SelectiveKVPolicy)
    assert p.match_key == "PrefixCacheMatchInfoDataKey/approx-prefix-cache-producer"
    assert "approx-prefix-cache-producer" in config.plugins


def test_only_the_gate_keeps_state_per_worker() -> None:
    assert SPEC.worker_state_of(SelectiveKVParameters(load_policy="disable")) == ""
    gated = SelectiveKVParameters(
        load_policy="threshold", min_external_reusable_tokens=1, max_waiting_requests=2
    )
    assert SPEC.worker_state_of(gated)


# --- the external reusable tokens -------------------------------------------------------------


@pytest.mark.parametrize(
    ("tiers", "expected"),
    [
        ({"gpu": 2, "cpu": 5}, 48),  # (5 - 2) x 16
        ({"gpu": 2, "cpu": 5, "disk": 7}, 80),  # the longest non-GPU tier
        ({"gpu": 2, "cpu": 5, "speculative": 8}, 48),  # speculative entries are not a tier
        ({"gpu": 6, "cpu": 5}, 0),  # never below 0
        ({"cpu": 3}, 48),
        ({"gpu": 3}, 0),
        ({}, 0),  # evidence of nothing: 0
    ],
)
def test_external_reusable_tokens(tiers: dict[str, int], expected: int) -> None:
    match = PrefixMatch(8, BLOCK_TOKENS * 4, {}, tiers=lambda _: tiers)
    assert external_reusable_tokens(match, "a") == expected


def test_no_tier_data_or_block_size_is_no_evidence() -> None:
    assert external_reusable_tokens(PrefixMatch(8, 64, {"a": 3}), "a") is None
    assert external_reusable_tokens(PrefixMatch(8, 0, {}, tiers=lambda _: {"cpu": 3}), "a") is None


# --- the load decision ------------------------------------------------------------------------


def test_threshold_is_inclusive_and_fails_open() -> None:
    tiers = {"a": {"gpu": 2, "cpu": 5}}  # 48 tokens outside GPU memory
    assert threshold(48).decide_load(on("a"), with_tiers(tiers)) == "enable"
    assert threshold(49).decide_load(on("a"), with_tiers(tiers)) == "disable"
    assert threshold(1).decide_load(on("b"), with_tiers(tiers)) == "disable"  # b: an empty map, 0
    assert threshold(1).decide_load(on("a"), with_tiers(None)) == "preserve"  # no tier data
    assert threshold(1).decide_load(on("a"), CycleState()) == "preserve"  # no match at all
    other = with_tiers(tiers, producer="another-producer")
    assert threshold(1).decide_load(on("a"), other) == "preserve"  # not the producer it reads


def test_threshold_looks_at_the_primary_profiles_first_target() -> None:
    tiers = {"d": {"cpu": 1}, "p": {"cpu": 9}}
    result = on("d", primary="decode", prefill=make_endpoint("p"))
    assert threshold(32).decide_load(result, with_tiers(tiers)) == "disable"  # d: 16 tokens
    assert threshold(32).decide_load(on("p", primary="prefill"), with_tiers(tiers)) == "enable"
    failed = SchedulingResult({"decode": None}, "decode")  # no target: preserve
    assert threshold(1).decide_load(failed, with_tiers(tiers)) == "preserve"


def test_disable_and_preserve_ignore_the_evidence() -> None:
    assert policy(load_policy="disable").decide_load(on("a"), CycleState()) == "disable"
    assert policy(offload_policy="disable").decide_load(on("a"), with_tiers({"a": {"cpu": 9}})) == "preserve"


# --- the waiting-queue gate -------------------------------------------------------------------


def at(queue: int, when: float | None, name: str = "a") -> Endpoint:
    return make_endpoint(name, queue=queue, update_time=when)


def test_the_gate_closes_at_the_limit_and_reopens_at_half() -> None:
    p = threshold(waiting=8)
    assert p.queue_closed(at(7, 100.0)) is False  # average 7
    assert p.queue_closed(at(10, 102.0)) is True  # half-life later: 7 + 0.5 x (10 - 7) = 8.5 >= 8
    assert p.queue_closed(at(10, 102.0)) is True  # the same scrape: no new sample
    assert p.queue_closed(at(0, 104.0)) is True  # 4.25 > 4: still closed
    assert p.queue_closed(at(0, 104.5)) is False  # 4.25 x 2^-0.25 = 3.57 <= 4: open again
    assert p.queue_closed(at(5, 108.5)) is False  # open: 3.57 + 0.75 x (5 - 3.57) = 4.64 < 8


def test_the_average_weighs_by_the_time_between_scrapes() -> None:
    p = threshold(waiting=100)
    p.queue_closed(at(0, 10.0))
    p.queue_closed(at(80, 11.0))  # weight 1 - 2^-0.5
    expected = 80 * (1 - 2**-0.5)
    assert math.isclose(p._queues["a"].average, expected)
    p.queue_closed(at(0, 17.0))
    assert math.isclose(p._queues["a"].average, expected * 2**-3)


def test_an_older_scrape_restarts_the_average() -> None:
    p = threshold(waiting=8)
    assert p.queue_closed(at(20, 100.0)) is True
    assert p.queue_closed(at(1, 50.0)) is False  # restarted at 1, and the gate with it
    assert p._queues["a"].sampled_at == 50.0


def test_no_scrape_time_or_no_limit_passes() -> None:
    assert threshold(waiting=8).queue_closed(at(99, None)) is False
    assert threshold(waiting=0).queue_closed(at(99, 5.0)) is False
    assert threshold(waiting=8).queue_closed(at(99, 5.0, name="")) is False


def test_the_gate_vetoes_loading_above_the_threshold_only() -> None:
    p = threshold(48, waiting=8)
    busy = at(20, 100.0)
    assert p.decide_load(on(busy), with_tiers({"a": {"cpu": 9}})) == "disable"
    p2 = threshold(48, waiting=8)
    assert (
        p2.decide_load(on(busy), with_tiers({"a": {"cpu": 1}})) == "disable"
    )  # below: the gate is not asked
    assert "a" not in p2._queues
    assert p2.decide_load(on(at(0, 100.0)), with_tiers({"a": {"cpu": 9}})) == "enable"


def test_a_removed_endpoint_forgets_its_gate() -> None:
    p = threshold(waiting=8)
    p.queue_closed(at(20, 100.0))
    p.endpoint_removed("a")
    assert p.queue_closed(at(1, 101.0)) is False


# --- kv_transfer_params -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "load", "offload", "after", "changed"),
    [
        ({}, "disable", "preserve", {"kv_transfer_params": {"max_load_tokens": 0}}, True),
        ({}, "preserve", "disable", {"kv_transfer_params": {"max_offload_tokens": 0}}, True),
        (
            {},
            "disable",
            "disable",
            {"kv_transfer_params": {"max_load_tokens": 0, "max_offload_tokens": 0}},
            True,
        ),
        ({}, "enable", "preserve", {}, False),  # nothing to remove: no object made
        ({"kv_transfer_params": None}, "enable", "preserve", {"kv_transfer_params": None}, False),
        (
            {"kv_transfer_params": "x"},
            "disable",
            "preserve",
            {"kv_transfer_params": {"max_load_tokens": 0}},
            True,
        ),
        (
            {"kv_transfer_params": {"max_load_tokens": 512, "do_remote_prefill": True}},
            "enable",
            "preserve",
            {"kv_transfer_params": {"do_remote_prefill": True}},
            True,
        ),
        (
            {"kv_transfer_params": {"max_load_tokens": 512, "remote_host": "h"}},
            "disable",
            "disable",
            {"kv_transfer_params": {"max_load_tokens": 0, "remote_host": "h", "max_offload_tokens": 0}},
            True,
        ),
        ({"kv_transfer_params": {"max_load_tokens": 0}}, "disable", "preserve", None, False),  # already 0
        ({"kv_transfer_params": {"max_load_tokens": 0.0}}, "disable", "preserve", None, False),
        (
            {"kv_transfer_params": {"max_load_tokens": False}},  # not a number: set
            "disable",
            "preserve",
            {"kv_transfer_params": {"max_load_tokens": 0}},
            True,
        ),
        ({"kv_transfer_params": {"max_offload_tokens": 0}}, "enable", "disable", None, False),
    ],
)
def test_mutate_kv_transfer_params(
    before: dict[str, Any], load: Any, offload: Any, after: dict[str, Any] | None, changed: bool
) -> None:
    payload = {"model": "m", **before}
    expected = {"model": "m", **(after if after is not None else before)}
    assert mutate_kv_transfer_params(payload, load, offload) is changed
    assert payload == expected


# --- PreRequest -------------------------------------------------------------------------------


def test_pre_request_edits_the_parsed_body_and_marks_it() -> None:
    request = chat(kv_transfer_params={"max_load_tokens": 64, "keep": 1})
    state = CycleState()
    policy(load_policy="disable", offload_policy="disable").pre_request(request, on("a"), state)
    assert raw(request)["kv_transfer_params"] == {"max_load_tokens": 0, "keep": 1, "max_offload_tokens": 0}
    assert state.read(BODY_MUTATED_KEY, bool) is True


def test_threshold_enable_removes_the_cap() -> None:
    request = chat(kv_transfer_params={"max_load_tokens": 64})
    state = with_tiers({"a": {"cpu": 9}})
    threshold(48).pre_request(request, on("a"), state)
    assert raw(request)["kv_transfer_params"] == {}
    assert state.read(BODY_MUTATED_KEY, bool) is True


def test_nothing_to_do_leaves_the_body_unmarked() -> None:
    request = chat(kv_transfer_params={"max_load_tokens": 64})
    state = with_tiers(None)  # no evidence: preserve, and offload preserved
    threshold(1).pre_request(request, on("a"), state)
    assert raw(request)["kv_transfer_params"] == {"max_load_tokens": 64}
    assert state.read(BODY_MUTATED_KEY, bool) is None
    request = chat(kv_transfer_params={"max_load_tokens": 0})
    state = CycleState()
    policy(load_policy="disable").pre_request(request, on("a"), state)  # already 0: unchanged
    assert state.read(BODY_MUTATED_KEY, bool) is None


def test_generate_and_unparsed_bodies_are_skipped() -> None:
    p = policy(load_policy="disable")
    generate = InferenceRequest("m", RequestBody(kind="generate", raw={"token_ids": [1, 2]}))
    state = CycleState()
    p.pre_request(generate, on("a"), state)
    assert generate.body.raw == {"token_ids": [1, 2]}
    assert state.read(BODY_MUTATED_KEY, bool) is None
    unparsed = InferenceRequest("m", RequestBody.completion("hi"))
    p.pre_request(unparsed, on("a"), state)
    assert unparsed.body.raw is None
    assert state.read(BODY_MUTATED_KEY, bool) is None


def test_on_the_request_path_through_a_config() -> None:
    config = load(
        """\
        plugins:
        - type: selective-kv-policy
          parameters: {loadPolicy: disable, offloadPolicy: disable}
        - type: random-picker
        """
    )
    path = RequestPath(config)
    request = chat(kv_transfer_params={"do_remote_decode": True})
    state = path.read_headers(request)
    result = path.decide_admitted(request, state, (make_endpoint("a"), make_endpoint("b")))
    assert result.targets
    assert raw(request)["kv_transfer_params"] == {
        "do_remote_decode": True,
        "max_load_tokens": 0,
        "max_offload_tokens": 0,
    }
    assert state.read(BODY_MUTATED_KEY, bool) is True
