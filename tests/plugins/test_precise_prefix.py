"""`precise-prefix-cache-producer` and `precise-prefix-cache-scorer`: per-candidate matches from the
engines' events, read by `prefix-cache-scorer`; speculative entries; endpoints leaving."""

from __future__ import annotations

from pathlib import Path

import pytest

from epick.config import load_config_text
from epick.framework import CycleState, TokenizedPrompt
from epick.kvcache import BlockHasher, BlockStored, EventBatch, event_hash
from epick.plugins.prefix.precise import PrecisePrefixCacheProducer
from epick.plugins.prefix.precise_parameters import PreciseParameters, parse_bytes
from epick.plugins.prefix.precise_scorer import PrecisePrefixCacheScorer
from epick.plugins.prefix.scorer import PrefixCacheScorer, PrefixMatch
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

A = make_endpoint("pod-a", address="10.0.0.1", port=8000)
B = make_endpoint("pod-b", address="10.0.0.2", port=8000)
C = make_endpoint("pod-c", address="10.0.0.3", port=8000)
TOKENS = tuple(range(1000, 1064))  # 4 blocks of 16
HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def engine_stores(
    producer: PrecisePrefixCacheProducer, pod: str, tokens: tuple[int, ...], model: str = "m"
) -> None:
    """What a vLLM engine with block size 16 publishes after computing `tokens`."""
    hasher = BlockHasher(16, "sha256_cbor", "42")
    hashes = tuple(event_hash(h) for h in hasher.block_hashes(tokens))
    event = BlockStored(hashes, None, tokens, 16, None, "GPU", None)
    producer.tracker.apply(pod, model, EventBatch(0.0, (event,), 0))


def tokenized(tokens: tuple[int, ...], **body: object) -> object:
    request = make_request("text", **body)
    request.body.set_tokenized(TokenizedPrompt((tokens,), request.body.cache_salt))
    return request


def test_the_match_is_each_candidates_run_of_blocks() -> None:
    producer = PrecisePrefixCacheProducer()
    engine_stores(producer, "10.0.0.1:8000", TOKENS)
    engine_stores(producer, "10.0.0.2:8000", TOKENS[:32])
    request = tokenized((*TOKENS, 7, 7, 7))  # a partial block has no key
    state = CycleState()
    producer.produce(request, state, [A, B, C])  # type: ignore[arg-type]
    match = state.read(producer.key, PrefixMatch)
    assert match is not None and match.total_blocks == 4
    assert match.matched == {"pod-a": 4, "pod-b": 2}
    scorer = PrefixCacheScorer(producer=producer.name)
    assert scorer.score(request, state, [A, B, C]) == [1.0, 0.5, 0.0]  # type: ignore[arg-type]


def test_no_tokens_or_a_short_prompt_writes_no_match() -> None:
    producer = PrecisePrefixCacheProducer()
    engine_stores(producer, "10.0.0.1:8000", TOKENS)
    for request in (make_request("untokenized"), tokenized(TOKENS[:10])):
        state = CycleState()
        producer.produce(request, state, [A])  # type: ignore[arg-type]
        assert state.read(producer.key, PrefixMatch) is None
    # a request with no tokens at all is counted, continuously, in a metric (a short one is not)
    assert producer.without_tokens == 1
    samples = {s.name: s.value for s in producer.metric_samples()}
    assert samples["epick_precise_prefix_requests_without_tokens"] == 1.0


def test_the_model_and_the_cache_salt_are_part_of_the_keys() -> None:
    producer = PrecisePrefixCacheProducer()
    engine_stores(producer, "10.0.0.1:8000", TOKENS, model="other-model")
    state = CycleState()
    producer.produce(tokenized(TOKENS), state, [A])  # type: ignore[arg-type]
    assert state.read(producer.key, PrefixMatch).matched == {}  # type: ignore[union-attr]
    # The engine hashed the salt into its first block (vLLM's extra keys): only salted requests meet it.
    hasher = BlockHasher(16, "sha256_cbor", "42")
    hashes = tuple(event_hash(h) for h in hasher.block_hashes(TOKENS, cache_salt="s"))
    event = BlockStored(hashes, None, TOKENS, 16, None, "GPU", None, (["s"], None, None, None))
    producer.tracker.apply("10.0.0.2:8000", "m", EventBatch(0.0, (event,), 0))
    salted, plain = CycleState(), CycleState()
    producer.produce(tokenized(TOKENS, cache_salt="s"), salted, [B])  # type: ignore[arg-type]
    producer.produce(tokenized(TOKENS), plain, [B])  # type: ignore[arg-type]
    assert salted.read(producer.key, PrefixMatch).matched == {"pod-b": 4}  # type: ignore[union-attr]
    assert plain.read(producer.key, PrefixMatch).matched == {}  # type: ignore[union-attr]


def test_speculative_entries_count_until_their_ttl() -> None:
    params = PreciseParameters.model_validate({"speculativeIndexing": True, "speculativeTTL": "2s"})
    producer = PrecisePrefixCacheProducer(params=params)
    now = [100.0]
    producer.clock = lambda: now[0]
    config = load_config_text(
        HEADER + "plugins:\n- type: token-producer\n- type: queue-scorer\n- type: max-score-picker\n"
    )
    request = tokenized(TOKENS)
    state = CycleState()
    producer.produce(request, state, [A, B])  # type: ignore[arg-type]
    result = config.scheduler.schedule(request, [A, B])  # type: ignore[arg-type]
    producer.pre_request(request, result, state)  # type: ignore[arg-type]
    target = result.targets[0].name
    again = CycleState()
    producer.produce(tokenized(TOKENS), again, [A, B])  # type: ignore[arg-type]
    assert again.read(producer.key, PrefixMatch).matched == {target: 4}  # type: ignore[union-attr]
    now[0] += 2.5
    later = CycleState()
    producer.produce(tokenized(TOKENS), later, [A, B])  # type: ignore[arg-type]
    assert later.read(producer.key, PrefixMatch).matched == {}  # type: ignore[union-attr]


def test_an_endpoint_that_leaves_leaves_the_index() -> None:
    producer = PrecisePrefixCacheProducer()
    engine_stores(producer, "10.0.0.1:8000", TOKENS)
    producer.endpoint_left("10.0.0.1:8000")
    state = CycleState()
    producer.produce(tokenized(TOKENS), state, [A])  # type: ignore[arg-type]
    assert state.read(producer.key, PrefixMatch).matched == {}  # type: ignore[union-attr]


def test_the_deprecated_scorer_scores_alone_or_from_the_configs_producer() -> None:
    alone = load_config_text(HEADER + "plugins:\n- type: precise-prefix-cache-scorer\n")
    scorer = alone.plugins["precise-prefix-cache-scorer"]
    assert isinstance(scorer, PrecisePrefixCacheScorer) and not scorer.delegating
    assert "token-producer" in alone.plugins  # upstream's default producer of its tokens
    engine_stores(scorer, "10.0.0.1:8000", TOKENS)
    request = tokenized(TOKENS)
    state = CycleState()
    scorer.produce(request, state, [A, B])  # type: ignore[arg-type]
    assert scorer.score(request, state, [A, B]) == [1.0, 0.0]  # type: ignore[arg-type]
    both = load_config_text(
        HEADER + "plugins:\n- type: precise-prefix-cache-producer\n- type: precise-prefix-cache-scorer\n"
    )
    assert both.plugins["precise-prefix-cache-scorer"].delegating  # type: ignore[attr-defined]


def test_parameters_as_upstream_spells_them() -> None:
    params = PreciseParameters.model_validate(
        {
            "tokenProcessorConfig": {"blockSize": 64, "hashSeed": 42},
            "indexerConfig": {
                "kvBlockIndexConfig": {
                    "inMemoryConfig": {"size": 1000, "podCacheSize": 4},
                    "enableMetrics": True,
                },
                "kvCacheBackendConfigs": [{"name": "GPU", "weight": 1.0}, {"name": "cpu", "weight": 0.5}],
            },
            "kvEventsConfig": {"zmqEndpoint": "tcp://*:5557", "podDiscoveryConfig": {"socketPort": 5556}},
        }
    )
    producer = PrecisePrefixCacheProducer(params=params)
    assert (producer.block_size, producer.processor.hash_seed) == (64, "42")
    assert (producer.index.size, producer.index.pod_cache_size) == (1000, 4)
    assert producer.weights == {"gpu": 1.0, "cpu": 0.5}
    assert producer.kv_events.zmq_endpoint == "tcp://*:5557" and producer.kv_events.socket_port == 5556
    cost = PreciseParameters.model_validate(
        {"indexerConfig": {"kvBlockIndexConfig": {"costAwareMemoryConfig": {"size": "3MB"}}}}
    )
    assert cost.index_size()[0] == 15_000
    assert parse_bytes("2GiB") == 2 * 1024**3 and parse_bytes("512 MB") == 512 * 10**6


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("{indexerConfig: {tokenizersPoolConfig: {modelName: m}}}", "configure a token-producer"),
        ("{kvEventsConfig: {podDiscoveryConfig: {socketPort: 70000}}}", "socketPort"),
        ("{indexerConfig: {kvBlockIndexConfig: {costAwareMemoryConfig: {size: lots}}}}", "not a size"),
    ],
)
def test_bad_parameters_are_named(parameters: str, message: str) -> None:
    from epick.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config_text(
            HEADER + f"plugins:\n- type: precise-prefix-cache-producer\n  parameters: {parameters}\n"
        )


def test_llm_d_precise_config_schedules_end_to_end_with_a_local_tokenizer(tmp_path: Path) -> None:
    data = Path(__file__).resolve().parents[1] / "data" / "tokenizer"
    config = load_config_text(
        HEADER + f"plugins:\n- type: token-producer\n  parameters: {{local: {{path: {data}}}}}\n"
        "- type: precise-prefix-cache-producer\n  parameters: {tokenProcessorConfig: {blockSize: 4}}\n"
        "- type: prefix-cache-scorer\n"
        "  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}\n"
        "- type: max-score-picker\n"
    )
    producer = config.plugins["precise-prefix-cache-producer"]
    assert isinstance(producer, PrecisePrefixCacheProducer)
    request = make_request(messages=[{"role": "user", "content": "Tell me about prefix caching in vLLM."}])
    path = RequestPath(config)
    first = path.decide(request, [A, B, C])
    assert request.body.tokenized is not None
    # The engine on pod-c reports the prompt's blocks: the next identical request goes there.
    tokens = request.body.tokenized.prompts[0]
    hasher = BlockHasher(16, "sha256", "0")
    event = BlockStored(
        tuple(event_hash(h) for h in hasher.block_hashes(tokens)), None, tokens, 16, None, None, None
    )
    producer.tracker.apply("10.0.0.3:8000", "m", EventBatch(0.0, (event,), None))
    again = make_request(messages=[{"role": "user", "content": "Tell me about prefix caching in vLLM."}])
    assert path.decide(again, [A, B, C]).targets[0].name == "pod-c"
    assert first.targets
