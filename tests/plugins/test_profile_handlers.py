"""Profile handlers (single, disagg, shadow) and P/D deciders, run through a real Scheduler."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from epick.framework import (
    CycleState,
    Endpoint,
    EndpointsFilteredError,
    InferenceRequest,
    NamedPlugin,
    ProfileRunResult,
    SchedulerProfile,
    SchedulingError,
    SchedulingResult,
    state_key,
)
from epick.plugins.filters.role import DecodeFilter, EncodeFilter, PrefillFilter
from epick.plugins.pickers.max_score import MaxScorePicker
from epick.plugins.prefix.scorer import PrefixCacheScorer, PrefixMatch
from epick.plugins.profile.deciders import (
    AlwaysDisaggDecider,
    MultimodalDecider,
    PDDecider,
    PrefixBasedDecider,
    PrefixDeciderParameters,
    media_of,
)
from epick.plugins.profile.disagg import DisaggParameters, DisaggProfileHandler, parse_stage_order
from epick.plugins.profile.peer import peer_endpoint
from epick.plugins.profile.shadow import ShadowParameters, ShadowProfileHandler
from epick.plugins.profile.single import SingleProfileHandler
from epick.plugins.scorers.queue import QueueScorer
from tests.builders import FakePlugin, make_endpoint, make_profile, make_request, make_scheduler


def names(endpoints: Sequence[Endpoint]) -> list[str]:
    return [ep.name for ep in endpoints]


class RecordingDecider(NamedPlugin):
    """A P/D decider that answers `answer` and records the decode endpoint it was shown."""

    plugin_type = "recording-decider"

    def __init__(self, answer: bool) -> None:
        super().__init__()
        self.answer = answer
        self.seen: list[str] = []

    def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool:
        self.seen.append(decode.name)
        return self.answer


def pd_pool() -> list[Endpoint]:
    # queue-scorer picks the shortest queue: d1 among decoders, p1 among prefillers
    return [
        make_endpoint("d1", role="decode", queue=0, address="10.0.0.1"),
        make_endpoint("d2", role="decode", queue=4, address="10.0.0.2"),
        make_endpoint("p1", role="prefill", queue=1, address="10.0.0.3"),
        make_endpoint("p2", role="prefill", queue=6, address="10.0.0.4"),
    ]


def pd_profiles(
    decode_name: str = "decode", prefill_name: str = "prefill"
) -> tuple[FakePlugin, FakePlugin, list[SchedulerProfile]]:
    """Decode and prefill profiles, each with a pass-through FakePlugin filter that counts its runs."""
    decode_probe, prefill_probe = FakePlugin("decode-probe"), FakePlugin("prefill-probe")
    decode = make_profile(decode_name, filters=[decode_probe, DecodeFilter()], scorers=[(QueueScorer(), 1.0)])
    prefill = make_profile(
        prefill_name, filters=[prefill_probe, PrefillFilter()], scorers=[(QueueScorer(), 1.0)]
    )
    return decode_probe, prefill_probe, [decode, prefill]


# --- single-profile-handler -----------------------------------------------------------------------


def test_single_profile_handler_returns_the_one_profile_result() -> None:
    pool = [make_endpoint("a", queue=3), make_endpoint("b", queue=0)]
    scheduler = make_scheduler(make_profile(scorers=[(QueueScorer(), 1.0)]), handler=SingleProfileHandler())
    result = scheduler.schedule(make_request(), pool)
    # queue: a (3-3)/3 = 0, b (3-0)/3 = 1 -> b
    assert names(result.targets) == ["b"]
    assert result.primary_profile == "default"
    assert list(result.profile_results) == ["default"]
    assert result.shadow_results == {}


def test_single_profile_handler_runs_only_the_first_profile() -> None:
    first_probe, second_probe = FakePlugin("first"), FakePlugin("second")
    scheduler = make_scheduler(
        make_profile("one", filters=[first_probe]), make_profile("two", filters=[second_probe])
    )
    result = scheduler.schedule(make_request(), [make_endpoint("a")])
    assert result.primary_profile == "one"
    assert first_probe.calls == ["filter"]
    assert second_probe.calls == []


def test_single_profile_handler_failure_names_the_filter() -> None:
    scheduler = make_scheduler(make_profile(filters=[PrefillFilter()]))
    with pytest.raises(EndpointsFilteredError, match="prefill-filter") as err:
        scheduler.schedule(make_request(), [make_endpoint("plain")])
    assert err.value.profile == "default"
    assert err.value.plugin == "prefill-filter/prefill-filter"


# --- disagg-profile-handler -----------------------------------------------------------------------


def test_disagg_without_decider_never_runs_prefill() -> None:
    decode_probe, prefill_probe, profiles = pd_profiles()
    scheduler = make_scheduler(*profiles, handler=DisaggProfileHandler())
    result = scheduler.schedule(make_request(), pd_pool())
    assert names(result.targets) == ["d1"]
    assert result.primary_profile == "decode"
    assert list(result.profile_results) == ["decode"]
    assert decode_probe.calls == ["filter"]
    assert prefill_probe.calls == []


def test_disagg_runs_decode_first_then_prefill_when_the_decider_agrees() -> None:
    decode_probe, prefill_probe, profiles = pd_profiles()
    decider = RecordingDecider(answer=True)
    scheduler = make_scheduler(*profiles, handler=DisaggProfileHandler(decider=decider))
    result = scheduler.schedule(make_request(), pd_pool())
    assert result.primary_profile == "decode"
    assert names(result.targets) == ["d1"]
    assert list(result.profile_results) == ["decode", "prefill"]
    prefill = result.profile_results["prefill"]
    assert prefill is not None and names(prefill.targets) == ["p1"]
    # the decider saw the chosen decode endpoint, after decode ran and before prefill did
    assert decider.seen == ["d1"]
    assert decode_probe.calls == ["filter"]
    assert prefill_probe.calls == ["filter"]


def test_disagg_decode_only_when_the_decider_declines() -> None:
    _, prefill_probe, profiles = pd_profiles()
    decider = RecordingDecider(answer=False)
    scheduler = make_scheduler(*profiles, handler=DisaggProfileHandler(decider=decider))
    result = scheduler.schedule(make_request(), pd_pool())
    assert list(result.profile_results) == ["decode"]
    assert decider.seen == ["d1"]
    assert prefill_probe.calls == []


def test_disagg_decode_failing_is_an_error_and_prefill_never_runs() -> None:
    _, prefill_probe, profiles = pd_profiles()
    decider = RecordingDecider(answer=True)
    scheduler = make_scheduler(*profiles, handler=DisaggProfileHandler(decider=decider))
    prefill_only = [ep for ep in pd_pool() if ep.role == "prefill"]
    with pytest.raises(EndpointsFilteredError, match="decode-filter") as err:
        scheduler.schedule(make_request(), prefill_only)
    assert err.value.profile == "decode"
    assert decider.seen == []
    assert prefill_probe.calls == []


def test_disagg_prefill_failing_serves_decode_only() -> None:
    _, prefill_probe, profiles = pd_profiles()
    scheduler = make_scheduler(*profiles, handler=DisaggProfileHandler(decider=AlwaysDisaggDecider()))
    decode_only = [ep for ep in pd_pool() if ep.role == "decode"]
    result = scheduler.schedule(make_request(), decode_only)
    assert names(result.targets) == ["d1"]
    assert list(result.profile_results) == ["decode"]
    assert prefill_probe.calls == ["filter"]  # it ran, and failed


def test_disagg_with_a_decider_but_no_prefill_profile_serves_decode_only() -> None:
    decode = make_profile("decode", filters=[DecodeFilter()])
    scheduler = make_scheduler(decode, handler=DisaggProfileHandler(decider=AlwaysDisaggDecider()))
    result = scheduler.schedule(make_request(), pd_pool())
    assert list(result.profile_results) == ["decode"]


def test_disagg_custom_profile_names() -> None:
    _, _, profiles = pd_profiles("dec", "pre")
    handler = DisaggProfileHandler(decode_profile="dec", prefill_profile="pre", decider=AlwaysDisaggDecider())
    result = make_scheduler(*profiles, handler=handler).schedule(make_request(), pd_pool())
    assert result.primary_profile == "dec"
    assert list(result.profile_results) == ["dec", "pre"]
    assert handler.required_profiles() == {"profiles.decode": "dec", "profiles.prefill": "pre"}
    assert DisaggProfileHandler().required_profiles() == {"profiles.decode": "decode"}


@pytest.mark.parametrize(
    ("params", "decode", "prefill", "decider"),
    [
        ({}, "decode", "prefill", None),
        ({"profiles": {"decode": "d", "prefill": "p"}, "deciders": {"prefill": "pd"}}, "d", "p", "pd"),
        ({"profiles": {"decode": "d"}}, "d", "prefill", None),
        # llm-d's older flat form
        ({"decodeProfile": "d", "prefillProfile": "p", "prefillDeciderPluginName": "pd"}, "d", "p", "pd"),
        ({"deciderPluginName": "pd2"}, "decode", "prefill", "pd2"),
    ],
)
def test_disagg_parameters(params: dict[str, object], decode: str, prefill: str, decider: str | None) -> None:
    parsed = DisaggParameters.model_validate(params)
    assert (parsed.decode(), parsed.prefill(), parsed.prefill_decider()) == (decode, prefill, decider)


def test_disagg_parameters_refuse_mixed_forms() -> None:
    with pytest.raises(ValidationError, match="cannot mix the flat parameters"):
        DisaggParameters.model_validate({"decodeProfile": "d", "profiles": {"prefill": "p"}})


# --- deciders -------------------------------------------------------------------------------------


def test_always_disagg_decider() -> None:
    decider = AlwaysDisaggDecider()
    assert isinstance(decider, PDDecider)
    assert decider.disaggregate(make_request(""), CycleState(), make_endpoint("d")) is True


def cycle_with_match(
    matched: dict[str, int], total_blocks: int, plugin: str = "prefix-cache-scorer"
) -> CycleState:
    cycle_state = CycleState()
    # blocks of 64 bytes (16 tokens)
    cycle_state.write(f"{plugin}/prefix-cache-scorer", PrefixMatch(total_blocks, 64, matched))
    return cycle_state


@pytest.mark.parametrize(
    ("threshold", "prompt_chars", "matched_on_d", "expected"),
    [
        # nonCachedTokens 0 turns prefix-based P/D off (upstream since llm-d v0.7)
        (0, 0, 0, False),
        (0, 640, 0, False),
        # prompt 396 // 4 = 99 < 100: no, even with nothing cached
        (100, 396, 0, False),
        # prompt 400 // 4 = 100 >= 100, cached 0: 100 - 0 >= 100 -> yes
        (100, 400, 0, True),
        # prompt 640 // 4 = 160: cached 3 blocks * 16 = 48 -> 112 >= 100 -> yes
        (100, 640, 3, True),
        # cached 4 * 16 = 64 -> 96 < 100 -> no
        (100, 640, 4, False),
        # all 10 blocks cached: 160 - 160 = 0 -> no
        (100, 640, 10, False),
        # threshold 90: 160 - 64 = 96 >= 90 -> yes
        (90, 640, 4, True),
    ],
)
def test_prefix_based_decider(threshold: int, prompt_chars: int, matched_on_d: int, expected: bool) -> None:
    decider = PrefixBasedDecider(non_cached_tokens=threshold)
    total = -(-prompt_chars // 64)
    cycle_state = cycle_with_match({"d": matched_on_d} if matched_on_d else {}, total)
    request = make_request("x" * prompt_chars)
    assert decider.disaggregate(request, cycle_state, make_endpoint("d")) is expected


def test_prefix_based_decider_uses_the_decode_endpoint_match_only() -> None:
    decider = PrefixBasedDecider(non_cached_tokens=100)
    # 160-token prompt fully cached on "other", nothing on "d": 160 - 0 >= 100 -> yes for d
    cycle_state = cycle_with_match({"other": 10}, 10)
    request = make_request("x" * 640)
    assert decider.disaggregate(request, cycle_state, make_endpoint("d")) is True
    assert decider.disaggregate(request, cycle_state, make_endpoint("other")) is False


def test_prefix_based_decider_without_a_prefix_match_says_no() -> None:
    decider = PrefixBasedDecider(non_cached_tokens=100)
    assert decider.disaggregate(make_request("x" * 4000), CycleState(), make_endpoint("d")) is False


def test_prefix_based_decider_reads_the_named_prefix_scorer() -> None:
    request = make_request("x" * 640)  # 160 tokens
    cycle_state = cycle_with_match({"d": 10}, 10, plugin="decode-prefix")  # all cached per decode-prefix
    cycle_state.write("prefill-prefix/prefix-cache-scorer", PrefixMatch(10, 64, {}))  # nothing per this one
    assert (
        PrefixBasedDecider(non_cached_tokens=100, prefix_plugin_name="decode-prefix").disaggregate(
            request, cycle_state, make_endpoint("d")
        )
        is False
    )
    assert (
        PrefixBasedDecider(non_cached_tokens=100, prefix_plugin_name="prefill-prefix").disaggregate(
            request, cycle_state, make_endpoint("d")
        )
        is True
    )
    # a name no scorer wrote under: no match -> no
    assert (
        PrefixBasedDecider(non_cached_tokens=100, prefix_plugin_name="missing").disaggregate(
            request, cycle_state, make_endpoint("d")
        )
        is False
    )


def test_prefix_decider_parameters() -> None:
    assert PrefixDeciderParameters().non_cached_tokens == 0
    assert PrefixDeciderParameters.model_validate({"nonCachedTokens": 256}).non_cached_tokens == 256
    with pytest.raises(ValidationError):
        PrefixDeciderParameters.model_validate({"nonCachedTokens": -1})


def test_prefix_based_pd_end_to_end_disaggregates_until_the_decode_endpoint_holds_the_prompt() -> None:
    prefix = PrefixCacheScorer()  # 16-token (64-char) blocks
    decode = make_profile("decode", filters=[DecodeFilter()], scorers=[(prefix, 3.0), (QueueScorer(), 1.0)])
    prefill = make_profile(
        "prefill", filters=[PrefillFilter()], scorers=[(prefix, 3.0), (QueueScorer(), 1.0)]
    )
    handler = DisaggProfileHandler(decider=PrefixBasedDecider(non_cached_tokens=100))
    scheduler = make_scheduler(decode, prefill, handler=handler)
    pool = pd_pool()

    # 160 tokens, nothing cached: 160 - 0 >= 100 -> d1 (shortest queue) decodes, p1 prefills
    first = make_request("q" * 640)
    result = scheduler.schedule(first, pool)
    assert {k: names(v.targets) for k, v in result.profile_results.items() if v} == {
        "decode": ["d1"],
        "prefill": ["p1"],
    }
    prefix.pre_request(first, result, CycleState())

    # the same prompt again: d1 holds all 10 blocks (160 tokens): 160 - 160 < 100 -> decode only
    again = make_request("q" * 640)
    result = scheduler.schedule(again, pool)
    assert list(result.profile_results) == ["decode"]
    assert names(result.targets) == ["d1"]


def test_prefix_match_found_in_the_decode_run_is_the_scorer_state() -> None:
    prefix = PrefixCacheScorer("pfx")
    decode = make_profile("decode", scorers=[(prefix, 1.0)])
    seen: list[PrefixMatch | None] = []

    class Peek(RecordingDecider):
        def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool:
            seen.append(cycle_state.read(state_key(prefix), PrefixMatch))
            return False

    prefill = make_profile("prefill")
    scheduler = make_scheduler(decode, prefill, handler=DisaggProfileHandler(decider=Peek(answer=False)))
    scheduler.schedule(make_request("z" * 130), [make_endpoint("d")])
    # 130 chars: 64 + 64 + 2 -> 3 blocks
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].total_blocks == 3


# --- shadow-profile-handler -----------------------------------------------------------------------


def shadow_setup() -> tuple[list[SchedulerProfile], list[Endpoint]]:
    pool = [make_endpoint("a", queue=0), make_endpoint("b", queue=5)]
    # default prefers a (short queue); candidate only lets b through
    default = make_profile("default", scorers=[(QueueScorer(), 1.0)])
    candidate = make_profile("candidate", filters=[FakePlugin("only-b", keep={"b"})])
    return [default, candidate], pool


def test_shadow_result_is_reported_not_acted_on() -> None:
    profiles, pool = shadow_setup()
    handler = ShadowProfileHandler(primary="default", shadows=["candidate"])
    result = make_scheduler(*profiles, handler=handler).schedule(make_request(), pool)
    assert result.primary_profile == "default"
    assert list(result.profile_results) == ["default"]
    assert names(result.targets) == ["a"]
    shadow = result.shadow_results["candidate"]
    assert shadow is not None and names(shadow.targets) == ["b"]


def test_a_failing_shadow_does_not_fail_the_request() -> None:
    pool = [make_endpoint("a")]
    default = make_profile("default")
    broken = make_profile("broken", filters=[FakePlugin("none", keep=set())])
    handler = ShadowProfileHandler(primary="default", shadows=["broken"])
    result = make_scheduler(default, broken, handler=handler).schedule(make_request(), pool)
    assert names(result.targets) == ["a"]
    assert result.shadow_results == {"broken": None}


def test_a_failing_primary_fails_with_its_own_error() -> None:
    pool = [make_endpoint("a")]
    default = make_profile("default", filters=[FakePlugin("none", keep=set())])
    shadow = make_profile("shadow")
    scheduler = make_scheduler(default, shadow, handler=ShadowProfileHandler(primary="default"))
    with pytest.raises(SchedulingError, match="none/fake") as err:
        scheduler.schedule(make_request(), pool)
    assert err.value.profile == "default"


def test_shadows_default_to_every_other_profile_in_order() -> None:
    order: list[str] = []

    class Probe(FakePlugin):
        def filter(
            self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
        ) -> list[Endpoint]:
            order.append(self.name)
            return super().filter(request, cycle_state, endpoints)

    profiles = [make_profile(n, filters=[Probe(n)]) for n in ("s1", "main", "s2")]
    handler = ShadowProfileHandler(primary="main")
    result = make_scheduler(*profiles, handler=handler).schedule(make_request(), [make_endpoint("a")])
    # primary first, then the others in profile order
    assert order == ["main", "s1", "s2"]
    assert list(result.profile_results) == ["main"]
    assert sorted(result.shadow_results) == ["s1", "s2"]


def test_explicit_shadows_run_only_those() -> None:
    probe = FakePlugin("unused")
    profiles = [make_profile("default"), make_profile("s1"), make_profile("s2", filters=[probe])]
    handler = ShadowProfileHandler(shadows=["s1"])
    result = make_scheduler(*profiles, handler=handler).schedule(make_request(), [make_endpoint("a")])
    assert list(result.shadow_results) == ["s1"]
    assert probe.calls == []
    assert handler.required_profiles() == {"primaryProfile": "default", "shadowProfiles[0]": "s1"}


def test_shadow_results_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    profiles, pool = shadow_setup()
    handler = ShadowProfileHandler(primary="default", shadows=["candidate"])
    with caplog.at_level(logging.DEBUG, logger="epick.plugins.profile.shadow"):
        make_scheduler(*profiles, handler=handler).schedule(make_request(request_id="r9"), pool)
    records = [r for r in caplog.records if r.getMessage() == "shadow profile result"]
    assert len(records) == 1
    assert records[0].__dict__["profile"] == "candidate"
    assert records[0].__dict__["targets"] == ["b"]
    assert records[0].__dict__["primary_targets"] == ["a"]


def test_shadow_parameters() -> None:
    defaults = ShadowParameters()
    assert (defaults.primary_profile, defaults.shadow_profiles) == ("default", None)
    parsed = ShadowParameters.model_validate({"primaryProfile": "p", "shadowProfiles": ["x", "y"]})
    assert (parsed.primary_profile, parsed.shadow_profiles) == ("p", ["x", "y"])


def test_prefix_based_decider_counts_non_ascii_prompts_in_the_units_of_the_index() -> None:
    d = make_endpoint("d")
    prefix = PrefixCacheScorer()  # 64-byte blocks
    prefix.pre_request(
        make_request("é" * 128), SchedulingResult({"decode": ProfileRunResult((d,))}, "decode"), CycleState()
    )
    cycle_state = CycleState()
    request = make_request("é" * 256)  # 512 bytes = 8 blocks; "é" * 128 holds the first 4
    # the scorer sees half the prompt cached on d: 4/8
    assert prefix.score(request, cycle_state, [d]) == [0.5]
    # in the index's units the prompt is 512 / 4 = 128 tokens, 4 * 16 = 64 cached: 128 - 64 = 64 >= 50 -> yes.
    # epick counts the prompt as 256 chars / 4 = 64 tokens: 64 - 64 = 0 < 50 -> no.
    assert PrefixBasedDecider(non_cached_tokens=50).disaggregate(request, cycle_state, d) is True


@pytest.mark.parametrize("shadows", [["default", "other"], ["other", "other"]])
def test_shadow_profiles_naming_the_primary_or_repeating_do_not_fail_every_request(
    shadows: list[str],
) -> None:
    profiles = [make_profile("default"), make_profile("other")]
    handler = ShadowProfileHandler(primary="default", shadows=shadows)
    result = make_scheduler(*profiles, handler=handler).schedule(make_request(), [make_endpoint("a")])
    assert names(result.targets) == ["a"]
    assert list(result.shadow_results) == ["other"]


# --- disagg-profile-handler: encode and stage order (llm-d-router's disagg_profile_handler.go) ------


def epd_pool() -> list[Endpoint]:
    return [
        *pd_pool(),
        make_endpoint("e1", role="encode", queue=0, address="10.0.0.5"),
        make_endpoint("e2", role="encode", queue=3, address="10.0.0.6"),
    ]


def epd_profiles() -> list[SchedulerProfile]:
    _, _, profiles = pd_profiles()
    encode = make_profile(
        "encode",
        filters=[EncodeFilter()],
        scorers=[(QueueScorer(), 1.0)],
        picker=MaxScorePicker(max_num_of_endpoints=2),
    )
    return [*profiles, encode]


IMAGE_CHAT = [
    {
        "role": "user",
        "content": [{"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": "x"}}],
    }
]


def test_encode_runs_for_a_multimodal_request_and_names_every_encoder() -> None:
    handler = DisaggProfileHandler(decider=AlwaysDisaggDecider(), encode_decider=MultimodalDecider())
    result = make_scheduler(*epd_profiles(), handler=handler).schedule(
        make_request(messages=IMAGE_CHAT), epd_pool()
    )
    assert list(result.profile_results) == ["decode", "prefill", "encode"]
    assert result.primary_profile == "decode" and result.targets[0].name == "d1"
    assert result.prefill is not None and result.prefill.name == "p1"
    # Both encoders, shortest queue first, comma-separated as upstream joins them.
    assert result.headers == {"x-encoder-hosts-ports": "10.0.0.5:8000,10.0.0.6:8000"}


def test_a_text_only_request_is_not_encoded_separately() -> None:
    handler = DisaggProfileHandler(encode_decider=MultimodalDecider())
    result = make_scheduler(*epd_profiles(), handler=handler).schedule(make_request("plain text"), epd_pool())
    assert list(result.profile_results) == ["decode"]
    assert result.headers == {}


def test_multimodal_decider_finds_media_kinds() -> None:
    assert media_of(make_request(messages=IMAGE_CHAT)) == {"image"}
    audio = [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
    ]
    assert media_of(make_request(messages=audio)) == {"audio"}
    assert media_of(make_request("no media")) == frozenset()


def test_prefill_first_runs_prefill_then_decode_with_the_prefill_endpoint_as_peer() -> None:
    seen: list[str | None] = []

    class PeerProbe(FakePlugin):
        def filter(self, request, cycle_state, endpoints):  # type: ignore[no-untyped-def]
            peer = peer_endpoint(cycle_state)
            seen.append(peer.name if peer is not None else None)
            return list(endpoints)

    _, _, profiles = pd_profiles()
    decode = make_profile(
        "decode", filters=[PeerProbe("peer"), DecodeFilter()], scorers=[(QueueScorer(), 1.0)]
    )
    handler = DisaggProfileHandler(stage_order="prefill-first")
    result = make_scheduler(decode, profiles[1], handler=handler).schedule(make_request(), pd_pool())
    assert list(result.profile_results) == ["decode", "prefill"]
    assert seen == ["p1"]
    assert result.targets[0].name == "d1" and result.prefill is not None and result.prefill.name == "p1"


@pytest.mark.parametrize(
    ("value", "order"),
    [
        ("decode-first", "decode-first"),
        ("Prefill_First", "prefill-first"),
        ("prefill", "prefill-first"),
        ("", "decode-first"),
    ],
)
def test_stage_order_spellings(value: str, order: str) -> None:
    assert parse_stage_order(value) == order


def test_stage_order_errors() -> None:
    with pytest.raises(ValueError, match='invalid stage order "sideways"'):
        DisaggParameters.model_validate({"stageOrder": "sideways"})
    with pytest.raises(ValueError, match="prefill decider is not supported in prefill-first stage order"):
        DisaggParameters.model_validate({"stageOrder": "prefill-first", "deciders": {"prefill": "x"}})
