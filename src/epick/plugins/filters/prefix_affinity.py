"""`prefix-cache-affinity-filter`: keep only the endpoints that very likely hold the prompt's prefix,
unless that would cost too much time to first token.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity):
an endpoint is sticky when matched blocks / prompt blocks (the prefix-match producer's data,
`prefixMatchInfoProducerName`) >= `affinityThreshold` (0.8; <= 0 turns the filter off; > 1 is an
error). With one candidate or none sticky, all pass; with probability `explorationProbability` (0) all
pass too. Otherwise the sticky ones pass, unless the load gate breaks stickiness: with
`maxTTFTPenaltyMs` > 0 (18000) and some candidate not sticky, the best sticky endpoint's estimated
TTFT minus the best other's must not exceed it, where TTFT = in-flight tokens /
`peakPrefillThroughput` (15928 tokens/s) × 1000 (`ttftSource: prefillThroughput`, reading
`inFlightLoadProducerName`'s producer, added with defaults when the config has none).
With `ttftSource: latencyPredictor` the TTFTs are the predictions of
`latencyPredictionInfoProducerName` (default `predicted-latency-producer`, added when the config has
none); a candidate without one never counts as the fastest.

The in-flight request gate (`maxInFlightRequestsDelta` > 0, which needs `maxTTFTPenaltyMs` > 0; 0, off,
by default; llm-d-router's affinity filter after ebab687, as its source reads in the PR that adds the
gate and the `request_load_override` outcome): when the stickiness holds, the non-sticky candidates on
which this request's estimated TTFT is within `maxTTFTPenaltyMs` of its best estimate on a sticky one
are added to the sticky ones, if the least-loaded sticky candidate holds more than
`maxInFlightRequestsDelta` requests in flight above the least-loaded of those added. The request's
TTFT is the endpoint's TTFT plus, with `prefillThroughput`, the prompt tokens it lacks /
`peakPrefillThroughput` × 1000; with `latencyPredictor`, the prediction. It reads the in-flight
producer whatever `ttftSource` says. Candidates without the needed data are left out of it.

Each decision is counted by outcome in llm_d_epp_prefix_cache_affinity_filter_decisions_total
{plugin_name, outcome} (llm-d-router #2494): `not_applicable` (one candidate, or the filter off),
`exploration`, `no_match` (none sticky), `missing_signal` (the load gate is on but the sticky or the
other side has no TTFT estimate), `load_override` (the gate broke stickiness),
`request_load_override` (the in-flight request gate added candidates), `sticky`. On a
missing signal the candidates pass as at ebab687 (the sticky ones unless only they lack an
estimate), where later upstream versions pass them all.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.framework.metrics import LLMD_SUBSYSTEM, MetricSample
from epick.framework.request import CHARS_PER_TOKEN
from epick.plugins.latency.predictions import LatencyPrediction, LatencyPredictions, read_predictions
from epick.plugins.latency.producer import DATA_TYPE as LATENCY_DATA_TYPE
from epick.plugins.latency.producer import TYPE as LATENCY_TYPE
from epick.plugins.latency.producer import resolve_latency
from epick.plugins.load.inflight import TYPE as INFLIGHT_TYPE
from epick.plugins.load.inflight import InFlightLoadProducer, resolve_inflight
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch, resolve_producer
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "prefix-cache-affinity-filter"


class PrefixAffinityParameters(Parameters):
    affinity_threshold: float = Field(default=0.8, le=1.0)
    exploration_probability: float = Field(default=0.0, ge=0.0, le=1.0)
    max_ttft_penalty_ms: float = Field(default=18000.0, ge=0, alias="maxTTFTPenaltyMs")
    ttft_source: Literal["prefillThroughput", "latencyPredictor"] = Field(
        default="prefillThroughput", alias="ttftSource"
    )
    peak_prefill_throughput: float = Field(default=15928.0, ge=0)
    max_in_flight_requests_delta: int = Field(default=0, ge=0)
    prefix_match_info_producer_name: str = ""
    in_flight_load_producer_name: str = ""
    latency_prediction_info_producer_name: str = ""

    @field_validator("ttft_source", mode="before")
    @classmethod
    def _source(cls, v: object) -> object:
        if v == "":
            raise ValueError('ttftSource must be "prefillThroughput" or "latencyPredictor", not empty')
        return v

    @model_validator(mode="after")
    def _throughput(self) -> PrefixAffinityParameters:
        if (
            self.ttft_source == "prefillThroughput"
            and self.max_ttft_penalty_ms > 0
            and self.peak_prefill_throughput <= 0
        ):
            raise ValueError("peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput")
        if self.max_in_flight_requests_delta > 0 and self.max_ttft_penalty_ms == 0:
            raise ValueError("maxTTFTPenaltyMs must be > 0 when maxInFlightRequestsDelta is set")
        return self


class PrefixCacheAffinityFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # the prefix match and the in-flight counts

    def __init__(
        self,
        name: str | None = None,
        params: PrefixAffinityParameters | None = None,
        *,
        prefix_producer: str | None = None,
        inflight: InFlightLoadProducer | None = None,
        latency_producer: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name)
        self.params = params or PrefixAffinityParameters()
        self.match_key = data_key(MATCH_DATA_TYPE, prefix_producer) if prefix_producer else None
        self.inflight = inflight
        self.latency_key = data_key(LATENCY_DATA_TYPE, latency_producer) if latency_producer else None
        self.rng = rng or random.Random()
        self.decisions: dict[str, int] = {}  # outcome -> decisions

    def ttft_ms(
        self, endpoint: Endpoint, predictions: Mapping[str, LatencyPrediction] | None = None
    ) -> float:
        if self.latency_key is not None:
            if isinstance(predictions, LatencyPredictions):  # the producer's columns, read in place
                i = predictions.index.get(endpoint.name)
                return float(predictions.ttft[i]) if i is not None else math.inf
            found = predictions.get(endpoint.name) if predictions else None
            return found.ttft if found is not None else math.inf
        tokens = self.inflight.load(endpoint.name).tokens if self.inflight is not None else 0
        return tokens / self.params.peak_prefill_throughput * 1000.0

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        outcome, kept = self._decide(cycle_state, endpoints)
        self.decisions[outcome] = self.decisions.get(outcome, 0) + 1
        return kept

    def _decide(self, cycle_state: CycleState, endpoints: Sequence[Endpoint]) -> tuple[str, list[Endpoint]]:
        p = self.params
        if len(endpoints) <= 1 or p.affinity_threshold <= 0:
            return "not_applicable", list(endpoints)
        if p.exploration_probability > 0 and self.rng.random() < p.exploration_probability:
            return "exploration", list(endpoints)
        match = cycle_state.read(self.match_key, PrefixMatch) if self.match_key else None
        if match is None or match.total_blocks <= 0:
            return "no_match", list(endpoints)
        sticky = [
            ep
            for ep in endpoints
            if match.matched.get(ep.name, 0) / match.total_blocks >= p.affinity_threshold
        ]
        if not sticky:
            return "no_match", list(endpoints)
        others = [ep for ep in endpoints if ep not in sticky]
        if p.max_ttft_penalty_ms > 0 and others:
            predictions = read_predictions(cycle_state, self.latency_key) if self.latency_key else None
            best_sticky = min(self.ttft_ms(ep, predictions) for ep in sticky)
            best_other = min(self.ttft_ms(ep, predictions) for ep in others)
            missing = math.isinf(best_sticky) or math.isinf(best_other)
            # Neither side predicted (inf − inf): no signal, no gate (upstream's MaxFloat64 − MaxFloat64).
            if best_sticky != best_other and best_sticky - best_other > p.max_ttft_penalty_ms:
                return ("missing_signal" if missing else "load_override"), list(endpoints)
            if missing:
                return "missing_signal", sticky
        if p.max_in_flight_requests_delta > 0 and others and self.inflight is not None:
            predictions = read_predictions(cycle_state, self.latency_key) if self.latency_key else None
            added = self._within_penalty(match, sticky, others, predictions)
            if added:
                least_sticky = min(self.inflight.load(ep.name).requests for ep in sticky)
                least_added = min(self.inflight.load(ep.name).requests for ep in added)
                if least_sticky - least_added > p.max_in_flight_requests_delta:
                    return "request_load_override", sticky + added
        return "sticky", sticky

    def _request_ttft_ms(
        self, match: PrefixMatch, endpoint: Endpoint, predictions: Mapping[str, LatencyPrediction] | None
    ) -> float:
        """This request's estimated TTFT on `endpoint` (inf: unknown): the endpoint's, plus (from
        throughput) the prompt tokens it lacks."""
        base = self.ttft_ms(endpoint, predictions)
        if self.latency_key is not None or math.isinf(base):
            return base
        lacking = (match.total_blocks - match.matched.get(endpoint.name, 0)) * match.block_bytes
        return base + lacking // CHARS_PER_TOKEN / self.params.peak_prefill_throughput * 1000.0

    def _within_penalty(
        self,
        match: PrefixMatch,
        sticky: Sequence[Endpoint],
        others: Sequence[Endpoint],
        predictions: Mapping[str, LatencyPrediction] | None,
    ) -> list[Endpoint]:
        """The non-sticky candidates on which the request's TTFT is within the penalty of its best on
        a sticky one (none when no sticky one has an estimate)."""
        best = min(self._request_ttft_ms(match, ep, predictions) for ep in sticky)
        if math.isinf(best):
            return []
        limit = self.params.max_ttft_penalty_ms
        return [ep for ep in others if self._request_ttft_ms(match, ep, predictions) - best <= limit]

    # ExportsMetrics
    def metric_samples(self) -> Iterator[MetricSample]:
        for outcome, count in sorted(self.decisions.items()):
            yield MetricSample(
                f"{LLMD_SUBSYSTEM}_prefix_cache_affinity_filter_decisions",
                "[ALPHA] Prefix cache affinity filter decisions, by outcome.",
                "counter",
                float(count),
                labels=(("plugin_name", self.name), ("outcome", outcome)),
                plugin_labels=False,
            )


def _factory(name: str, params: PrefixAffinityParameters, handle: Handle) -> PrefixCacheAffinityFilter:
    prefix = resolve_producer(handle, params.prefix_match_info_producer_name, "prefixMatchInfoProducerName")
    inflight = None
    latency: str | None = None
    if params.max_ttft_penalty_ms > 0 and params.ttft_source == "latencyPredictor":
        producer = resolve_latency(
            handle, params.latency_prediction_info_producer_name, "latencyPredictionInfoProducerName"
        )
        latency = producer.name if producer is not None else LATENCY_TYPE
    if (params.max_ttft_penalty_ms > 0 and params.ttft_source == "prefillThroughput") or (
        params.max_in_flight_requests_delta > 0
    ):
        inflight = resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName")
    return PrefixCacheAffinityFilter(
        name,
        params,
        prefix_producer=prefix or "approx-prefix-cache-producer",
        inflight=inflight,
        latency_producer=latency,
        rng=handle.rng(name),
    )


def _requires(params: PrefixAffinityParameters, api_version: str = "") -> tuple[str, ...]:
    needed = [] if params.prefix_match_info_producer_name else ["approx-prefix-cache-producer"]
    gated = params.max_ttft_penalty_ms > 0 and params.ttft_source == "prefillThroughput"
    if (gated or params.max_in_flight_requests_delta > 0) and not params.in_flight_load_producer_name:
        needed.append(INFLIGHT_TYPE)
    predicted = params.max_ttft_penalty_ms > 0 and params.ttft_source == "latencyPredictor"
    if predicted and not params.latency_prediction_info_producer_name:
        needed.append(LATENCY_TYPE)
    return tuple(needed)


SPEC = PluginSpec(
    TYPE,
    _factory,
    PrefixAffinityParameters,
    "only endpoints likely holding the prefix, unless TTFT suffers",
    requires=_requires,
    worker_state="",
)
