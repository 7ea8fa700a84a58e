"""`latency-observation-scorer-hub` (llm-d, Alpha): rank candidates by the TTFT each is predicted to
give at the load it carries now, from what `latency-observer-producer-hub` observed.

As upstream's (llm-d/llm-d-router PR #2371 at its head f60405d8, which a415a8aa merges onto ebab687
unchanged: pkg/epp/framework/plugins/scheduling/scorer/latencyobservation, plugin.go and README.md).
Upstream's category is Distribution: it spreads load (epick has no scorer categories; `category`
records it).
It reads the snapshots of `ttftPercentilesProducerName` (default the config's
`latency-observer-producer-hub`, added with default parameters when the config has none) and the live
requests in flight of `inFlightLoadProducerName` (default `inflight-load-producer`, added likewise).

For each candidate, with snapshot m and floor = m.floor() (0: cold):
- it has a baseline when floor > 0, m.recent_request_count >= m.calibration_threshold,
  m.inflight_at_typical_load > 0, m.typical_load_ttft > floor, and its in-flight count can be read
  (an in-flight producer exists);
- with a baseline, the prediction at cur = its requests in flight now is the curve through
  A (0, floor), B (inflight_at_low_load, low_load_ttft), C (inflight_at_typical_load,
  typical_load_ttft): B is used when C and B are at least `minInflightGap` apart in load,
  typical > low > floor in TTFT, and B's load > 0; then A→B below B's load and B→C (extended past C)
  from it; without B the chord A→C, extended. The prediction is at least the floor;
- without a baseline it is the floor (0 when cold); with `roundTTFTStep` > 0 every prediction is
  rounded to a multiple of the step (half away from zero, as Go's math.Round).
Scores: all 1 when no candidate has a floor. Otherwise a cold candidate takes the smallest
prediction among those with a floor, and score = (max − pred) / (max − min), 1 when max = min.
Then each candidate without a baseline, when `explorationRate` > 0, scores 1 with probability
`explorationRate` (one draw per such candidate, in order), else 0 if any candidate has a baseline.

Parameters: `explorationRate` 0.1 ([0, 1]), `minInflightGap` 2.0 (> 0), `roundTTFTStep` 0 (seconds,
>= 0; 0: no rounding), `ttftPercentilesProducerName`, `inFlightLoadProducerName`.

Deviations: the draws come from the config's seeded random source (upstream: Go's global one). epick
logs no line per candidate; `epick explain` shows the scores. Upstream registers no metrics, nor does
epick. The scorer keeps no state of its own; what it reads is the observer's, per worker under
`epick serve --workers`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.latency.observer import (
    COLD,
    INFLIGHT_TYPE,
    LatencyObserver,
    TTFTPercentiles,
    resolve_observer,
)
from epick.plugins.latency.observer import TYPE as OBSERVER_TYPE
from epick.plugins.latency.scorer import go_round
from epick.plugins.load.inflight import InFlightLoadProducer, resolve_inflight
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "latency-observation-scorer-hub"
CATEGORY = "Distribution"  # upstream's scorer category


class ObservationScorerParameters(Parameters):
    exploration_rate: float = 0.1
    min_inflight_gap: float = 2.0
    round_ttft_step: float = Field(default=0.0, alias="roundTTFTStep")
    ttft_percentiles_producer_name: str = ""
    in_flight_load_producer_name: str = ""


def check_parameters(p: ObservationScorerParameters) -> None:
    """Upstream's `Config.validate`, as `ParameterError`s at the parameter's name."""
    if not 0.0 <= p.exploration_rate <= 1.0:
        raise ParameterError(
            "explorationRate", f"explorationRate must be in [0, 1], got {p.exploration_rate}"
        )
    if not p.min_inflight_gap > 0:
        raise ParameterError("minInflightGap", f"minInflightGap must be > 0, got {p.min_inflight_gap}")
    if not p.round_ttft_step >= 0 or not math.isfinite(p.round_ttft_step):
        raise ParameterError("roundTTFTStep", f"roundTTFTStep must be >= 0, got {p.round_ttft_step}")


@dataclass(frozen=True, slots=True)
class Calibration:
    """What a snapshot alone says of an endpoint (upstream's `calibration`)."""

    floor: float
    has_floor: bool
    has_baseline: bool


def calibration(m: TTFTPercentiles) -> Calibration:
    floor = m.floor()
    if floor == 0:
        return Calibration(0.0, False, False)
    baseline = (
        m.recent_request_count >= m.calibration_threshold
        and m.inflight_at_typical_load > 0
        and m.typical_load_ttft > floor
    )
    return Calibration(floor, True, baseline)


def predict(m: TTFTPercentiles, floor: float, cur: float, min_inflight_gap: float) -> float:
    """The TTFT at `cur` requests in flight on the curve A (0, floor), B (low), C (typical)."""
    use_low = (
        m.inflight_at_typical_load - m.inflight_at_low_load >= min_inflight_gap
        and m.typical_load_ttft > m.low_load_ttft
        and m.low_load_ttft > floor
        and m.inflight_at_low_load > 0
    )
    if use_low and cur < m.inflight_at_low_load:  # A -> B
        pred = floor + cur * (m.low_load_ttft - floor) / m.inflight_at_low_load
    elif use_low:  # B -> C, extended past C
        pred = m.low_load_ttft + (cur - m.inflight_at_low_load) * (m.typical_load_ttft - m.low_load_ttft) / (
            m.inflight_at_typical_load - m.inflight_at_low_load
        )
    else:  # A -> C, extended past C
        pred = floor + cur * (m.typical_load_ttft - floor) / m.inflight_at_typical_load
    return max(pred, floor)


class LatencyObservationScorer(NamedPlugin):
    plugin_type = TYPE
    # The observer's snapshots and the live in-flight counts (earlier requests), and a random draw.
    reads = Reads.HISTORY
    category = CATEGORY

    def __init__(
        self,
        name: str | None = None,
        params: ObservationScorerParameters | None = None,
        *,
        observer: LatencyObserver | None = None,
        inflight: InFlightLoadProducer | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name)
        p = params or ObservationScorerParameters()
        check_parameters(p)
        self.exploration_rate = p.exploration_rate
        self.min_inflight_gap = p.min_inflight_gap
        self.round_ttft_step = p.round_ttft_step
        self.observer = observer
        self.inflight = inflight
        self.rng = rng or random.Random()

    def predictions(self, endpoints: Sequence[Endpoint]) -> list[tuple[float, Calibration]]:
        """Each endpoint's predicted TTFT (seconds; 0 when cold) and calibration, baselines demoted
        where no in-flight count can be read."""
        names = [ep.name for ep in endpoints]
        observed = self.observer.percentiles_of(names) if self.observer is not None else [COLD] * len(names)
        out: list[tuple[float, Calibration]] = []
        for name, m in zip(names, observed, strict=True):
            c = calibration(m)
            if c.has_baseline and self.inflight is None:
                c = Calibration(c.floor, c.has_floor, False)
            if c.has_baseline:
                assert self.inflight is not None
                pred = predict(m, c.floor, float(self.inflight.load(name).requests), self.min_inflight_gap)
            else:
                pred = c.floor  # a seed at the floor; 0 when cold
            step = self.round_ttft_step
            if step > 0:
                pred = go_round(pred / step) * step
            out.append((pred, c))
        return out

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        evals = self.predictions(endpoints)
        floored = [pred for pred, c in evals if c.has_floor]
        if not floored:  # nothing to rank: the picker's tie-break spreads the traffic
            return [1.0] * len(endpoints)
        low, high = min(floored), max(0.0, *floored)
        any_baseline = any(c.has_baseline for _, c in evals)
        scores: list[float] = []
        for predicted, c in evals:
            pred = predicted if c.has_floor else low  # a cold endpoint: an optimistic seed
            score = 1.0 if high == low else (high - pred) / (high - low)
            if self.exploration_rate > 0 and not c.has_baseline:
                if self.rng.random() < self.exploration_rate:
                    score = 1.0
                elif any_baseline:
                    score = 0.0
            scores.append(score)
        return scores


def _factory(name: str, params: ObservationScorerParameters, handle: Handle) -> LatencyObservationScorer:
    observer = resolve_observer(handle, params.ttft_percentiles_producer_name, "ttftPercentilesProducerName")
    inflight = resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName")
    return LatencyObservationScorer(name, params, observer=observer, inflight=inflight, rng=handle.rng(name))


def _requires(params: ObservationScorerParameters, api_version: str = "") -> tuple[str, ...]:
    """Upstream's default producers: the observer and the in-flight counts, unless named."""
    needed = [] if params.ttft_percentiles_producer_name else [OBSERVER_TYPE]
    if not params.in_flight_load_producer_name:
        needed.append(INFLIGHT_TYPE)
    return tuple(needed)


SPEC = PluginSpec(
    TYPE,
    _factory,
    ObservationScorerParameters,
    "the least TTFT predicted at each endpoint's load now, from the observed TTFTs",
    requires=_requires,
    worker_state="",
)
