"""`predicted-latency-producer`: each candidate's predicted TTFT and TPOT for the request, its headroom
against the request's latency objectives, and training data from the responses.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency):
- Before scheduling, for every candidate: the features of `predictor.FEATURES` (the prefix match of
  `prefixMatchInfoProducerName`, default `approx-prefix-cache-producer`; the in-flight load of
  `inFlightLoadProducerName`, default `inflight-load-producer`, else the scrape's running count), then
  one bulk prediction. Each candidate gets a `LatencyPrediction`: TTFT valid when predicted TTFT <
  the TTFT objective (`x-llm-d-slo-ttft-ms`), TTFT headroom = objective − predicted. With
  `streamingMode`, TPOT is checked against the TPOT objective × `sloBufferFactor`, tightened to the
  smallest TPOT objective among the requests this producer has running on that endpoint (× the
  factor); without it, or on an endpoint whose `endpointRoleLabel` label says `prefill`, TPOT is
  valid with headroom 0. A request with no objective has objective 0: every prediction is then
  invalid with headroom −TTFT, which the latency scorer ranks by least TTFT.
- PreRequest: the request joins the primary target's running set (with its TPOT objective), and the
  dispatch time and the features the target was predicted from are kept until the response ends, or
  for `contextTTL` after the request was last heard of (<= 0: for ever). A request decided again (a
  retry) leaves the endpoint it was first sent to.
- The responses train the predictor: in streaming mode the first chunk gives the TTFT (a response
  that ends without an earlier chunk trains nothing, as upstream); otherwise the TTFT is the whole
  response's time, as upstream. At the end, TPOT = (end − dispatch − TTFT) /
  (tokens − 1), tokens being the usage's completion tokens when reported, else the chunks seen
  (upstream counts chunks). Failed responses train nothing.
- `predictInProduce: false` collects training data and predicts nothing.

The predictor runs in process (upstream calls a sidecar): analytic until it has responses, then the
learned model of epick.plugins.latency.learners, refitted as responses arrive. Its settings are epick's
own parameters: `predictor.learner` ("gbdt", the default where LightGBM is installed, or "analytic";
epick's image has no LightGBM, so there the default is "analytic"), `window`, `minSamples`,
`retrainEvery`, and `analytic` (`stepMs`, `prefillTokensPerSecond`, `ttftPerRunningMs`,
`tpotPerRunningMs`, `tpotFullKvMs`).
Accepted and ignored as upstream: `samplingMean`, `maxDecodeTokenSamplesForPrediction`. With
`useEncoderCacheFeatures` epick reads nothing more (its predictor has no encoder features; said at
load). Metrics: epick's own `llm_d_epp_predicted_latency_*` (docs/service.md), not upstream's
`inference_objective_request_*` histograms.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    Response,
    SchedulingResult,
)
from epick.framework.datalayer import data_key
from epick.framework.metrics import EPICK_PREFIX, MetricSample
from epick.plugins.debug_state import MAX_LISTED, capped
from epick.plugins.latency.accuracy import ACCURACY_COUNTERS, Accuracy, LatencyFamilies
from epick.plugins.latency.learners import GBDT_MISSING, learner_for
from epick.plugins.latency.parameters import PredictedLatencyParameters
from epick.plugins.latency.predictions import LatencyPrediction, LatencyPredictions, read_predictions
from epick.plugins.latency.predictor import Matrix, OnlinePredictor, feature_matrix
from epick.plugins.latency.slo import Objectives, objectives
from epick.plugins.load.inflight import InFlightLoadProducer, prompt_tokens, resolve_inflight
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch, resolve_producer
from epick.plugins.registry import Handle, PluginSpec, typed_producer

TYPE = "predicted-latency-producer"
PRODUCER_WORKER_STATE = "its latency model and the requests it saw running"
DATA_TYPE = "LatencyPredictionInfoDataKey"
PREFILL_PROFILE = "prefill"

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Context:
    """What one request's decision left for its response to train on."""

    created: float
    objectives: Objectives
    model: str = ""  # the model served (the metrics' label)
    rows: Matrix | None = None  # the candidates' features, one row each
    index: dict[str, int] = field(default_factory=dict)  # endpoint name -> its row
    predictions: LatencyPredictions | None = None
    target: str | None = None  # where it was dispatched (the primary target)
    trained_on: str | None = None  # whose features train the TTFT (the prefill target if any)
    dispatched_at: float = 0.0
    ttft_ms: float = 0.0
    chunks: int = 0

    def predicted(self, endpoint: str | None, what: str) -> float | None:
        """The TTFT or TPOT predicted for `endpoint` at the decision, if one was."""
        i = self.index.get(endpoint) if endpoint is not None else None
        if i is None or self.predictions is None:
            return None
        return float((self.predictions.ttft if what == "ttft" else self.predictions.tpot)[i])

    def row(self, endpoint: str | None) -> Matrix | None:
        i = self.index.get(endpoint) if endpoint is not None else None
        return self.rows[i] if i is not None and self.rows is not None else None


class _RunningSet:
    """The requests running on one endpoint, with the smallest TPOT objective among them first."""

    def __init__(self) -> None:
        self.slos: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []

    def add(self, key: int, tpot_ms: float) -> None:
        if key in self.slos:
            return
        self.slos[key] = tpot_ms
        heapq.heappush(self._heap, (tpot_ms, key))

    def remove(self, key: int) -> None:
        self.slos.pop(key, None)
        if len(self._heap) > 2 * len(self.slos) + 16:  # mostly departed requests: rebuild
            self._heap = [(slo, k) for k, slo in self.slos.items()]
            heapq.heapify(self._heap)

    def min_tpot(self) -> float:
        heap = self._heap
        while heap and self.slos.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # a request that has left
        return heap[0][0] if heap else 0.0

    def __len__(self) -> int:
        return len(self.slos)


class PredictedLatencyProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS | Reads.HEADERS | Reads.PROMPT_SIZE | Reads.TOKENS | Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        params: PredictedLatencyParameters | None = None,
        *,
        prefix_producer: str | None = None,
        inflight: InFlightLoadProducer | None = None,
        predictor: OnlinePredictor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self.params = params or PredictedLatencyParameters()
        p = self.params.predictor
        self.predictor = predictor or OnlinePredictor(
            learner_for(p.learner_name),
            analytic=p.analytic.model(),
            window=p.window,
            min_samples=p.min_samples,
            retrain_every=p.retrain_every,
        )
        self.key = data_key(DATA_TYPE, self.name)
        self.match_key = data_key(MATCH_DATA_TYPE, prefix_producer) if prefix_producer else None
        self.inflight = inflight
        self.clock = clock
        self._contexts: dict[int, _Context] = {}  # by InferenceRequest.key, oldest first
        self._running: dict[str, _RunningSet] = {}
        self.ttft_accuracy = Accuracy()
        self.tpot_accuracy = Accuracy()
        self.latencies = LatencyFamilies()  # upstream's per-request families

    # ExportsMetrics: how the predictions compare with the responses (epick's own names; upstream
    # records histograms per request under inference_objective_*).
    def metric_samples(self) -> Iterator[MetricSample]:
        yield from self.latencies.samples()
        prefix = f"{EPICK_PREFIX}_predicted_latency"
        accuracy = (("ttft", self.ttft_accuracy), ("tpot", self.tpot_accuracy))
        for name, doc, value in ACCURACY_COUNTERS:
            for target, of in accuracy:
                yield MetricSample(
                    f"{prefix}_{name}", doc, "counter", float(value(of)), (("target", target),)
                )
        fits, trained = self.predictor.fits, self.predictor.trained
        for i, target in enumerate(("ttft", "tpot")):
            labels = (("target", target),)
            yield MetricSample(
                f"{prefix}_model_fits",
                "Models fitted on the observed responses",
                "counter",
                float(fits[i]),
                labels,
            )
            yield MetricSample(
                f"{prefix}_learned",
                "1 when a learned model answers, 0 while the analytic model does",
                "gauge",
                float(trained[i]),
                labels,
            )

    # What consumers read.
    def predictions(self, cycle_state: CycleState) -> Mapping[str, LatencyPrediction] | None:
        return read_predictions(cycle_state, self.key)

    def dispatched(self, endpoint: str) -> int:
        running = self._running.get(endpoint)
        return len(running) if running is not None else 0

    def features(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Matrix:
        """One row of `predictor.FEATURES` per candidate."""
        n = len(endpoints)
        prompt = prompt_tokens(request)
        match = cycle_state.read(self.match_key, PrefixMatch) if self.match_key else None
        names = [ep.name for ep in endpoints]
        metrics = [ep.metrics for ep in endpoints]
        if self.inflight is not None:
            running, tokens = self.inflight.loads(names)
        else:
            running, tokens = [m.running_requests_size for m in metrics], [0] * n
        if match is not None and match.total_blocks > 0:
            held, total = match.matched, match.total_blocks
            prefix = [held.get(name, 0) / total for name in names]
        else:
            prefix = [0.0] * n
        role_label = self.params.endpoint_role_label
        return feature_matrix(
            kv_cache=[m.kv_cache_usage_percent for m in metrics],
            input_tokens=[prompt] * n,
            waiting=[m.waiting_queue_size for m in metrics],
            running=running,
            prefix_score=prefix,
            prefill_tokens=tokens,
            pod_types=[ep.labels.get(role_label, "") for ep in endpoints] if role_label else None,
        )

    # DataProducer.
    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        now = self.clock()
        self._expire(now)
        ctx = _Context(now, objectives(request.headers), request.target_model or "unknown")
        x = self.features(request, cycle_state, endpoints)
        ctx.rows = x
        ctx.index = {ep.name: i for i, ep in enumerate(endpoints)}
        old = self._contexts.pop(request.key, None)
        if old is not None:  # decided again (a retry elsewhere): it leaves the endpoint it was sent to
            self._leave(request.key, old)
        self._contexts[request.key] = ctx
        if not self.params.predict_in_produce or not endpoints:
            return
        ttft, tpot = self.predictor.predict(x)
        predictions = self._judge(ctx.objectives, endpoints, ctx.index, ttft, tpot)
        ctx.predictions = predictions
        cycle_state.write(self.key, predictions)

    def _judge(
        self,
        slo: Objectives,
        endpoints: Sequence[Endpoint],
        index: dict[str, int],
        ttft: Matrix,
        tpot: Matrix,
    ) -> LatencyPredictions:
        """Each candidate's validity and headroom against the request's objectives."""
        p = self.params
        running = self._running
        dispatched = [len(running[ep.name]) if ep.name in running else 0 for ep in endpoints]
        ttft_headroom = slo.ttft_ms - ttft
        if p.streaming_mode:
            # The objective × the buffer, tightened by the strictest request running there.
            tightest = np.array(
                [running[ep.name].min_tpot() if ep.name in running else 0.0 for ep in endpoints]
            )
            buffered = np.full(len(endpoints), slo.tpot_ms * p.slo_buffer_factor)
            buffered = np.where(tightest > 0, np.minimum(buffered, tightest * p.slo_buffer_factor), buffered)
            tpot_headroom = buffered - tpot
            tpot_valid = tpot < buffered
            role_label = p.endpoint_role_label
            if role_label:  # a prefill endpoint is never judged on TPOT
                prefill = np.array([ep.labels.get(role_label) == "prefill" for ep in endpoints])
                tpot_headroom = np.where(prefill, 0.0, tpot_headroom)
                tpot_valid = tpot_valid | prefill
        else:
            tpot_headroom = np.zeros(len(endpoints))
            tpot_valid = np.ones(len(endpoints), dtype=np.bool_)
        return LatencyPredictions(
            index,
            ttft=ttft,
            tpot=tpot,
            ttft_headroom=ttft_headroom,
            tpot_headroom=tpot_headroom,
            ttft_valid=ttft < slo.ttft_ms,
            tpot_valid=tpot_valid,
            dispatched=dispatched,
        )

    # PreRequest: the request runs on its primary target from now.
    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        ctx = self._contexts.get(request.key)
        if ctx is None:
            return
        if ctx.target is not None:  # decided again (a retry elsewhere): it leaves the old endpoint
            self._leave(request.key, ctx)
        primary = result.profile_results.get(result.primary_profile)
        if primary is None or not primary.targets:
            return
        ctx.target = primary.targets[0].name
        ctx.trained_on = ctx.target
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.targets:
            ctx.trained_on = prefill.targets[0].name
        ctx.dispatched_at = self.clock()
        ctx.ttft_ms = 0.0
        ctx.chunks = 0
        self._touch(request.key, ctx, ctx.dispatched_at)
        self._running.setdefault(ctx.target, _RunningSet()).add(request.key, ctx.objectives.tpot_ms)

    # Responses: training data.
    def response_streaming(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        ctx = self._contexts.get(request.key)
        if ctx is None or ctx.target is None:
            return
        ctx.chunks += 1
        now = self.clock()
        self._touch(request.key, ctx, now)
        if ctx.ttft_ms == 0.0 and self.params.streaming_mode and not response.end_of_stream:
            ctx.ttft_ms = max((now - ctx.dispatched_at) * 1000.0, 1e-3)
            self._train_ttft(ctx)

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        ctx = self._contexts.pop(request.key, None)
        if ctx is None or ctx.target is None:
            return
        self._leave(request.key, ctx)
        if response.error is not None or response.status >= 400:
            return
        elapsed_ms = (self.clock() - ctx.dispatched_at) * 1000.0
        if ctx.ttft_ms == 0.0:
            if self.params.streaming_mode:
                return  # streaming mode, yet no chunk came before the end: nothing to learn (upstream)
            ctx.ttft_ms = max(elapsed_ms, 1e-3)
            self._train_ttft(ctx)
        tokens = response.usage.completion_tokens if response.usage is not None else 0
        if tokens <= 0:
            tokens = ctx.chunks
        if tokens > 1:
            tpot = (elapsed_ms - ctx.ttft_ms) / (tokens - 1)
            row = ctx.row(ctx.target)
            if row is not None and tpot > 0:
                self.predictor.observe_tpot(row, tpot)
                predicted = ctx.predicted(ctx.target, "tpot")
                self.tpot_accuracy.add(tpot, predicted, ctx.objectives.tpot_ms)
                self.latencies.observe(ctx.model, "tpot", tpot, predicted, ctx.objectives.tpot_ms)

    def _train_ttft(self, ctx: _Context) -> None:
        row = ctx.row(ctx.trained_on)
        if row is not None:
            self.predictor.observe_ttft(row, ctx.ttft_ms)
            predicted = ctx.predicted(ctx.trained_on, "ttft")
            self.ttft_accuracy.add(ctx.ttft_ms, predicted, ctx.objectives.ttft_ms)
            self.latencies.observe(ctx.model, "ttft", ctx.ttft_ms, predicted, ctx.objectives.ttft_ms)

    def _leave(self, key: int, ctx: _Context) -> None:
        if ctx.target is None:
            return
        running = self._running.get(ctx.target)
        if running is not None:
            running.remove(key)
            if not running:
                del self._running[ctx.target]

    def _touch(self, key: int, ctx: _Context, now: float) -> None:
        """The request was heard of: its TTL starts again (upstream's cache extends an entry on every
        read), and it moves to the back of the expiry order."""
        ctx.created = now
        contexts = self._contexts
        if contexts.get(key) is ctx:
            contexts[key] = contexts.pop(key)

    def _expire(self, now: float) -> None:
        """Forget requests not heard of for `contextTTL` (a response never reported), and their running
        entries with them, as upstream's TTL cache does; a TTL <= 0 never expires (as there)."""
        if self.params.context_ttl <= 0:
            return
        cutoff = now - self.params.context_ttl
        contexts = self._contexts
        while contexts:
            key, ctx = next(iter(contexts.items()))
            if ctx.created >= cutoff:
                return
            del contexts[key]
            self._leave(key, ctx)

    def dump_state(self) -> object:
        """Requests running per endpoint with the tightest TPOT objective among them
        (`/debug/plugins/state`), as upstream's."""
        names = capped(self._running)
        return {
            "endpoints": [
                {
                    "endpoint": n,
                    "runningRequests": len(self._running[n]),
                    "minTpotSlo": self._running[n].min_tpot(),
                }
                for n in names
            ],
            "totalEndpoints": len(self._running),
            "maxEndpoints": MAX_LISTED,
            "truncated": len(self._running) > MAX_LISTED,
            "trackedRequests": len(self._contexts),
        }

    def endpoint_removed(self, name: str) -> None:
        self._running.pop(name, None)


def _factory(name: str, params: PredictedLatencyParameters, handle: Handle) -> PredictedLatencyProducer:
    if params.use_encoder_cache_features:
        log.warning(
            "%s: useEncoderCacheFeatures has no effect in epick (the predictor has no encoder features)",
            name,
        )
    if params.predictor.learner is None and params.predictor.learner_name == "analytic":
        log.warning("%s: the predictor runs its analytic model only: %s", name, GBDT_MISSING)
    prefix = resolve_producer(handle, params.prefix_match_info_producer_name, "prefixMatchInfoProducerName")
    inflight = resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName")
    return PredictedLatencyProducer(
        name, params, prefix_producer=prefix, inflight=inflight, clock=handle.clock
    )


def requires_inputs(params: PredictedLatencyParameters, api_version: str = "") -> tuple[str, ...]:
    """The producers a predicting plugin reads (added with defaults when the config names none)."""
    needed = [] if params.prefix_match_info_producer_name else ["approx-prefix-cache-producer"]
    if not params.in_flight_load_producer_name:
        needed.append("inflight-load-producer")
    return tuple(needed)


def resolve_latency(handle: Handle, producer_name: str, parameter: str) -> PredictedLatencyProducer | None:
    """The predicted-latency producer a consumer reads: the one named, else the config's
    `predicted-latency-producer`, else None."""
    return typed_producer(
        handle,
        producer_name,
        TYPE,
        parameter,
        PredictedLatencyProducer,
        what="predicted-latency producer",
        produces="latency predictions",
    )


def requires_latency(params: Any, api_version: str = "") -> tuple[str, ...]:
    """For consumers: upstream creates the default producer when a config has none."""
    return () if getattr(params, "latency_prediction_info_producer_name", "") else (TYPE,)


SPEC = PluginSpec(
    TYPE,
    _factory,
    PredictedLatencyParameters,
    "predicted TTFT and TPOT per candidate, and their headroom against the request's objectives",
    requires=requires_inputs,
    worker_state=PRODUCER_WORKER_STATE,
)
