"""`approx-prefix-cache-producer` and its consumers, in llm-d's layout (producer + stateless scorer).

Expected values are worked out by hand from upstream's documented rules: blocks of max(blockSizeTokens,
64) tokens × 4 bytes, the token cap over the block size, the primary and `prefill` targets recorded.
"""

from __future__ import annotations

import textwrap

import pytest

from epick.config import ConfigError, LoadedConfig, load_config_text
from epick.framework import CycleState, Metrics
from epick.plugins.prefix.producer import ApproxPrefixCacheProducer, ApproxPrefixParameters, match_key
from epick.plugins.prefix.scorer import PrefixCacheScorer, PrefixMatch
from epick.plugins.scorers.no_hit_lru import NoHitLruScorer
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
BLOCK = 64 * 4  # bytes per block at upstream's minimum block size


def load(body: str) -> LoadedConfig:
    return load_config_text(HEADER + textwrap.dedent(body), seed=0)


LLMD = """\
plugins:
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}
- type: no-hit-lru-scorer
  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""


def test_block_size_is_raised_to_64_tokens_and_the_token_cap_sets_the_block_cap() -> None:
    p = ApproxPrefixCacheProducer(params=ApproxPrefixParameters(auto_tune=False))
    assert p.block_size_tokens([]) == 64  # 16 by default, raised to upstream's minimum
    assert p.max_blocks(64) == 131072 // 64 == 2048
    capped = ApproxPrefixCacheProducer(
        params=ApproxPrefixParameters(max_prefix_tokens_to_match=0, max_prefix_blocks_to_match=3)
    )
    assert capped.max_blocks(64) == 3
    unlimited = ApproxPrefixCacheProducer(
        params=ApproxPrefixParameters(max_prefix_tokens_to_match=0, max_prefix_blocks_to_match=0)
    )
    assert unlimited.max_blocks(64) > 10**9


def test_auto_tune_takes_the_block_size_an_endpoint_reports() -> None:
    p = ApproxPrefixCacheProducer(params=ApproxPrefixParameters(block_size_tokens=128))
    ep = make_endpoint("a").with_metrics(Metrics(cache_block_size=256))
    assert p.block_size_tokens([ep]) == 256
    off = ApproxPrefixCacheProducer(params=ApproxPrefixParameters(block_size_tokens=128, auto_tune=False))
    assert off.block_size_tokens([ep]) == 128


def test_deprecated_block_size_stands_in_for_an_unset_block_size_tokens() -> None:
    assert ApproxPrefixParameters(block_size=100).effective_block_size_tokens() == 100
    assert ApproxPrefixParameters(block_size=100, block_size_tokens=80).effective_block_size_tokens() == 80


def test_produce_counts_blocks_and_records_the_primary_and_prefill_targets() -> None:
    config = load(LLMD)
    producer = config.plugins["approx-prefix-cache-producer"]
    assert isinstance(producer, ApproxPrefixCacheProducer)
    eps = (make_endpoint("a"), make_endpoint("b"))
    prompt = "x" * (3 * BLOCK + 10)  # 3 whole blocks and a partial one: 4 blocks
    path = RequestPath(config)
    first = path.decide(make_request(prompt, request_id="r1"), eps)
    chosen = first.targets[0].name
    # The second time, the chosen endpoint holds all 4 blocks; the producer says so before scheduling.
    state = CycleState()
    producer.produce(make_request(prompt), state, eps)
    match = state.read(match_key(), PrefixMatch)
    assert match is not None
    assert match.total_blocks == 4
    assert dict(match.matched) == {chosen: 4}
    assert path.decide(make_request(prompt, request_id="r2"), eps).targets[0].name == chosen


def test_scorer_reads_the_named_producer_and_keeps_no_index() -> None:
    config = load(LLMD)
    scorer = config.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrefixCacheScorer)
    eps = [make_endpoint("a"), make_endpoint("b")]
    state = CycleState()
    state.write(match_key(), PrefixMatch(4, BLOCK, {"a": 3}))
    assert scorer.score(make_request("p"), state, eps) == [0.75, 0.0]
    # Without the producer's data (it failed), every endpoint scores 0.
    assert scorer.score(make_request("p"), CycleState(), eps) == [0.0, 0.0]


def test_match_length_weight_blends_in_the_matched_tokens() -> None:
    config = load(
        LLMD.replace(
            "{prefixMatchInfoProducerName: approx-prefix-cache-producer}\n- type: no-hit",
            "{matchLengthWeight: 0.5}\n- type: no-hit",
        )
    )
    scorer = config.plugins["prefix-cache-scorer"]
    state = CycleState()
    state.write(match_key(), PrefixMatch(4, BLOCK, {"a": 3}))
    # match 3 blocks × 64 tokens = 192 of 8192: 0.5 × (192/8192)² + 0.5 × 3/4
    (score,) = scorer.score(make_request("p"), state, [make_endpoint("a")])
    assert score == pytest.approx(0.5 * (192 / 8192) ** 2 + 0.375)


def test_no_hit_lru_reads_the_producer_match() -> None:
    config = load(LLMD)
    lru = config.plugins["no-hit-lru-scorer"]
    assert isinstance(lru, NoHitLruScorer)
    state = CycleState()
    state.write(match_key(), PrefixMatch(2, BLOCK, {"a": 1}))
    assert lru.score(make_request("p"), state, [make_endpoint("a"), make_endpoint("b")]) == [0.5, 0.5]


def test_under_llmd_a_bare_scorer_reads_a_default_producer() -> None:
    # llm-d-router's loader creates the producer with default parameters: 64-token blocks.
    config = load("plugins:\n- type: prefix-cache-scorer\n")
    scorer = config.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrefixCacheScorer)
    assert scorer.producer_key == "PrefixCacheMatchInfoDataKey/approx-prefix-cache-producer"
    producer = config.plugins["approx-prefix-cache-producer"]
    assert isinstance(producer, ApproxPrefixCacheProducer) and producer.block_size_tokens([]) == 64


def test_a_scorer_that_sizes_its_index_or_a_gie_config_keeps_its_own_index() -> None:
    # llm-d's older configs size the scorer's own index; GIE v1.5's loader gives the scorer a
    # producer built from the scorer's own parameters, which is what epick's own index is.
    sized = load("plugins:\n- type: prefix-cache-scorer\n  parameters: {blockSizeTokens: 32}\n")
    gie = load_config_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: prefix-cache-scorer\n"
    )
    for config in (sized, gie):
        scorer = config.plugins["prefix-cache-scorer"]
        assert isinstance(scorer, PrefixCacheScorer) and scorer.producer_key is None
        assert "approx-prefix-cache-producer" not in config.plugins


def test_a_producer_of_the_default_name_is_used_without_being_named() -> None:
    config = load("plugins:\n- type: approx-prefix-cache-producer\n- type: prefix-cache-scorer\n")
    scorer = config.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrefixCacheScorer)
    assert scorer.producer_key == "PrefixCacheMatchInfoDataKey/approx-prefix-cache-producer"


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        (
            "plugins:\n- type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: nope}\n",
            "plugins[0].parameters.prefixMatchInfoProducerName",
            "no prefix-match producer named 'nope'",
        ),
        (
            "plugins:\n- type: queue-scorer\n- type: prefix-cache-scorer\n"
            "  parameters: {prefixMatchInfoProducerName: queue-scorer}\n",
            "plugins[1].parameters.prefixMatchInfoProducerName",
            "does not produce prefix-match data",
        ),
        (
            "plugins:\n- type: approx-prefix-cache-producer\n"
            "  parameters: {autoTune: false, blockSizeTokens: 0}\n",
            "plugins[0].parameters",
            "blockSizeTokens must be > 0 when autoTune is disabled",
        ),
        (
            "plugins:\n- type: approx-prefix-cache-producer\n  parameters: {maxPrefixTokensToMatch: -1}\n",
            "plugins[0].parameters.maxPrefixTokensToMatch",
            "",
        ),
        (
            "plugins:\n- type: prefix-cache-scorer\n  parameters: {matchLengthWeight: 1.5}\n",
            "plugins[0].parameters.matchLengthWeight",
            "",
        ),
        (
            "plugins:\n- type: prefix-cache-scorer\n"
            "  parameters: {matchLengthWeight: 0.5, matchLengthScaleTokens: 0}\n",
            "plugins[0].parameters",
            "matchLengthScaleTokens must be greater than 0",
        ),
    ],
)
def test_bad_parameters_name_their_path(body: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(body)
    issue = info.value.issues[0]
    assert issue.path == path
    assert message in issue.message
