"""`mm-embeddings-cache-producer` and `mm-embeddings-cache-scorer`: media hashes, per-endpoint LRUs,
the optimistic update after a decision, and the score (cases from llm-d/llm-d-router's
dataproducer/multimodal and scorer/mmcacheaffinity tests, checked by hand)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xxhash
import yaml

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState, InferenceRequest, ProfileRunResult, SchedulingResult
from epick.plugins.multimodal.items import MediaItem, media_hash, media_items
from epick.plugins.multimodal.producer import (
    EncoderCacheMatch,
    MMEmbeddingsCacheProducer,
    capacity_of,
    match_key,
)
from epick.plugins.multimodal.scorer import MMEmbeddingsCacheScorer
from epick.plugins.parsers.vllmhttp import VllmHttpParser
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

CAT = "https://example.com/cat.png"
DOG = "data:image/png;base64,iVBORw0KGgo="


def chat(*parts: dict[str, Any]) -> InferenceRequest:
    return make_request(messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}])


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def decided(*targets: str, primary: str = "default") -> SchedulingResult:
    return SchedulingResult({primary: ProfileRunResult(tuple(make_endpoint(t) for t in targets))}, primary)


def test_a_hash_is_xxh64_of_the_string_in_unpadded_lowercase_hex() -> None:
    assert media_hash(DOG) == format(xxhash.xxh64_intdigest(DOG.encode()), "x")
    assert media_hash("") == "ef46db3751d8e999"  # XXH64 of nothing, seed 0
    # No zero padding: some string's hash is shorter than 16 digits.
    assert any(len(media_hash(str(i))) < 16 for i in range(200))


def test_media_parts_are_found_as_upstreams_estimate_tokenizer_finds_them() -> None:
    request = chat(
        image(CAT),
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},
        image(CAT),  # repeated: one item
    )
    assert media_items(request) == (
        MediaItem(media_hash(CAT), "image"),
        MediaItem(media_hash("https://example.com/v.mp4"), "video"),
        MediaItem(media_hash("AAAAwav"), "audio"),
        MediaItem(media_hash(""), "audio"),  # audio_url has no input_audio: upstream hashes ""
    )


def test_text_only_and_string_content_have_no_items() -> None:
    assert media_items(make_request("a completion prompt")) == ()
    assert media_items(make_request(messages=[{"role": "user", "content": CAT}])) == ()


def test_anthropic_image_blocks_hash_the_url_else_the_base64_payload() -> None:
    request = make_request(
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"},
                    },
                    {
                        "type": "tool_result",
                        "content": [{"type": "image", "source": {"type": "url", "url": CAT}}],
                    },
                ],
            }
        ]
    )
    assert [i.hash for i in media_items(request)] == [media_hash("QUJD"), media_hash(CAT)]


def test_a_generate_body_carries_vllms_own_hashes_in_placeholder_order() -> None:
    body = {
        "model": "m",
        "token_ids": [1, 2, 3],
        "features": {
            "mm_hashes": {"image": ["img-b", "img-a"], "audio": ["aud-1", "aud-unplaced"]},
            "mm_placeholders": {
                "image": [{"offset": 40, "length": 8}, {"offset": 2, "length": 8}],
                "audio": [{"offset": 20, "length": 4}],
            },
        },
    }
    parsed = VllmHttpParser().parse_request("/inference/v1/generate", json.dumps(body).encode(), {})
    request = InferenceRequest(parsed.model, parsed.body)
    assert media_items(request) == (
        MediaItem("img-a", "image"),
        MediaItem("aud-1", "audio"),
        MediaItem("img-b", "image"),
    )


@pytest.mark.parametrize(("mb", "entries"), [(4, 2), (2048, 1024), (0, 2048), (-5, 2048), (1, 1)])
def test_capacity_is_one_entry_per_2_mb(mb: int, entries: int) -> None:
    assert capacity_of(mb) == entries


def test_produce_matches_the_endpoints_holding_an_item_and_pre_request_records_the_target() -> None:
    producer = MMEmbeddingsCacheProducer()
    producer.record("pod-a", [MediaItem(media_hash(CAT), "image")])
    producer.record("pod-b", [MediaItem(media_hash(CAT), "image")])
    pods = [make_endpoint(n) for n in ("pod-a", "pod-b", "pod-c")]
    request, state = chat(image(CAT), image(DOG)), CycleState()
    producer.produce(request, state, pods)
    match = state.read(match_key(), EncoderCacheMatch)
    assert match is not None
    cat, dog = MediaItem(media_hash(CAT), "image"), MediaItem(media_hash(DOG), "image")
    assert match.request_items == (cat, dog)
    assert [match.matched_items(p) for p in ("pod-a", "pod-b", "pod-c")] == [(cat,), (cat,), ()]
    producer.pre_request(request, decided("pod-c"), state)
    assert [producer.holds(p, cat.hash) for p in ("pod-a", "pod-b", "pod-c")] == [True, True, True]
    assert [producer.holds(p, dog.hash) for p in ("pod-a", "pod-b", "pod-c")] == [False, False, True]


def test_a_request_without_media_publishes_nothing_and_records_nothing() -> None:
    producer, state = MMEmbeddingsCacheProducer(), CycleState()
    request = make_request("text")
    producer.produce(request, state, [make_endpoint("pod-a")])
    assert state.keys() == []
    producer.pre_request(request, decided("pod-a"), state)
    assert producer.caches == {}


def test_only_the_primary_profiles_targets_are_recorded() -> None:
    producer, state = MMEmbeddingsCacheProducer(), CycleState()
    request = chat(image(CAT))
    producer.produce(request, state, [make_endpoint("d"), make_endpoint("p")])
    result = SchedulingResult(
        {
            "decode": ProfileRunResult((make_endpoint("d"),)),
            "prefill": ProfileRunResult((make_endpoint("p"),)),
        },
        "decode",
    )
    producer.pre_request(request, result, state)
    assert set(producer.caches) == {"d"}


def test_the_lru_evicts_the_least_recently_sent_item_and_lookups_do_not_refresh() -> None:
    producer = MMEmbeddingsCacheProducer(cache_size_mb=4)  # 2 entries
    for url in ("u1", "u2"):
        request, state = chat(image(url)), CycleState()
        producer.produce(request, state, [make_endpoint("pod-a")])
        producer.pre_request(request, decided("pod-a"), state)
    producer.produce(chat(image("u1")), CycleState(), [make_endpoint("pod-a")])  # a lookup only
    request, state = chat(image("u3")), CycleState()
    producer.produce(request, state, [make_endpoint("pod-a")])
    producer.pre_request(request, decided("pod-a"), state)
    assert [producer.holds("pod-a", media_hash(u)) for u in ("u1", "u2", "u3")] == [False, True, True]


def test_an_endpoint_that_leaves_loses_its_cache() -> None:
    producer = MMEmbeddingsCacheProducer()
    for pod in ("pod-a", "pod-b"):
        producer.record(pod, [MediaItem("h", "image")])
    producer.endpoint_removed("pod-b")
    assert (producer.holds("pod-a", "h"), producer.holds("pod-b", "h")) == (True, False)


def test_the_score_is_the_held_share_of_the_requests_items_by_size() -> None:
    scorer, state = MMEmbeddingsCacheScorer(), CycleState()
    big, small = MediaItem("image", "image", 80), MediaItem("icon", "image", 20)
    state.write(match_key(), EncoderCacheMatch((big, small), {"a": (big,), "b": (small,)}))
    pods = [make_endpoint(n) for n in ("a", "b", "c")]
    assert scorer.score(make_request(), state, pods) == [0.8, 0.2, 0.0]


def test_no_match_info_or_no_request_items_scores_zero() -> None:
    scorer, pods = MMEmbeddingsCacheScorer(), [make_endpoint("a")]
    assert scorer.score(make_request(), CycleState(), pods) == [0.0]
    state = CycleState()
    state.write(match_key(), EncoderCacheMatch((), {"a": (MediaItem("h", "image"),)}))
    assert scorer.score(make_request(), state, pods) == [0.0]


def load(plugins: list[dict[str, Any]], profile: list[str]) -> Any:
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [*plugins, {"type": "max-score-picker"}],
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": p} for p in [*profile, "max-score-picker"]]}
        ],
    }
    return load_config_text(yaml.safe_dump(doc, sort_keys=False), source="test.yaml", seed=0)


def test_a_scorer_without_a_producer_gets_a_default_one_that_feeds_it() -> None:
    config = load([{"type": "mm-embeddings-cache-scorer"}], ["mm-embeddings-cache-scorer"])
    producer = config.plugins["mm-embeddings-cache-producer"]
    assert isinstance(producer, MMEmbeddingsCacheProducer)
    assert producer.capacity == 2048
    path, pool = RequestPath(config), [make_endpoint(n) for n in ("a", "b", "c")]
    producer.record("b", [MediaItem(media_hash(CAT), "image")])
    assert [path.decide(chat(image(CAT)), pool).targets[0].name for _ in range(3)] == ["b"] * 3
    # The decision records the new image where it sends it: the next request with it follows.
    first = path.decide(chat(image(DOG)), pool).targets[0].name
    assert [path.decide(chat(image(DOG)), pool).targets[0].name for _ in range(5)] == [first] * 5


def test_cache_size_parameters_and_a_named_producer() -> None:
    plugins = [
        {"type": "mm-embeddings-cache-producer", "name": "mm", "parameters": {"cacheSizeInMB": 6}},
        {"type": "mm-embeddings-cache-scorer", "parameters": {"producerName": "mm"}},
    ]
    config = load(plugins, ["mm-embeddings-cache-scorer"])
    assert config.plugins["mm"].capacity == 3
    assert config.plugins["mm-embeddings-cache-scorer"].key == match_key("mm")
    spelled = [{"type": "mm-embeddings-cache-producer", "parameters": {"cacheSizeInMBPerServer": 4}}]
    assert load(spelled, []).plugins["mm-embeddings-cache-producer"].capacity == 2


@pytest.mark.parametrize(
    ("plugins", "path", "words"),
    [
        (
            [{"type": "mm-embeddings-cache-producer", "parameters": {"cacheSizeInMBPerServer": "bad"}}],
            "plugins[0].parameters.cacheSizeInMBPerServer",
            "integer",
        ),
        (
            [{"type": "mm-embeddings-cache-scorer", "parameters": {"producerName": "nope"}}],
            "plugins[0].parameters.producerName",
            "no multimodal cache producer named 'nope'",
        ),
        (
            [
                {"type": "queue-scorer"},
                {"type": "mm-embeddings-cache-scorer", "parameters": {"producerName": "queue-scorer"}},
            ],
            "plugins[1].parameters.producerName",
            "does not produce multimodal cache matches",
        ),
    ],
)
def test_bad_parameters_are_errors_naming_the_path(
    plugins: list[dict[str, Any]], path: str, words: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load(plugins, [])
    assert any(i.path == path and words in i.message for i in e.value.issues), e.value.issues
