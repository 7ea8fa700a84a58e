"""A scheduler profile and the runtime of one profile run: filter, score, pick."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from epick.framework.cycle_state import CycleState
from epick.framework.endpoint import Endpoint
from epick.framework.errors import EndpointsFilteredError, SchedulingError
from epick.framework.interfaces import FILTER, PICKER, SCORER, Filter, Picker, PluginTimer, Scorer
from epick.framework.plugin import Plugin
from epick.framework.reads import depends_on_metrics_alone
from epick.framework.request import InferenceRequest
from epick.framework.results import ProfileRunResult, ScoredEndpoints
from epick.framework.trace import FilterStep, ProfileTrace, ScorerStep

_E = TypeVar("_E", bound=SchedulingError)


def scores_key(profile: str) -> str:
    """The cycle-state key under which a profile's run leaves its scored candidates (`ScoredEndpoints`:
    the survivors of its filters and their weighted totals)."""
    return f"scores/{profile}"


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"scorer {self.scorer.typed_name}: weight must be a finite number >= 0")


class _ScoreMemo:
    """Weighted scores of the metrics-only scorers for one (snapshot version, candidates)."""

    __slots__ = ("cacheable", "endpoints", "lead_count", "lead_sum", "scorers", "version", "weighted")

    def __init__(self) -> None:
        self.scorers: list[WeightedScorer] = []
        self.cacheable: list[bool] = []
        self.lead_count = 0  # how many scorers, from the first, are cacheable
        self.version: int | None = None
        self.endpoints: tuple[Endpoint, ...] = ()
        self.weighted: list[list[float] | None] = []
        self.lead_sum: list[float] | None = None

    def prepare(self, scorers: list[WeightedScorer], version: int, endpoints: Sequence[Endpoint]) -> None:
        """Keep what was computed if nothing it depends on changed; else start empty."""
        if len(scorers) != len(self.scorers) or any(
            a is not b for a, b in zip(scorers, self.scorers, strict=True)
        ):
            self.scorers = list(scorers)
            self.cacheable = [depends_on_metrics_alone(ws.scorer) for ws in scorers]
            self.lead_count = next((i for i, c in enumerate(self.cacheable) if not c), len(scorers))
            self.version = None
        candidates = endpoints if isinstance(endpoints, tuple) else tuple(endpoints)
        if version == self.version and candidates == self.endpoints:
            return
        self.version, self.endpoints = version, candidates
        self.weighted = [None] * len(scorers)
        self.lead_sum = None


@dataclass(slots=True)
class SchedulerProfile:
    """Filters (run in order), weighted scorers, and exactly one picker.

    A profile without scorers is valid: every survivor then has total 0 and the picker decides.
    """

    name: str
    picker: Picker
    filters: list[Filter] = field(default_factory=list)
    scorers: list[WeightedScorer] = field(default_factory=list)
    # Scores of scorers that read only metrics (`depends_on_metrics_alone`), kept for the snapshot
    # version and candidates they were computed on: per scorer, its weighted scores, and the sum of the
    # leading run of such scorers, so a request on an unchanged snapshot adds only the others.
    _memo: _ScoreMemo = field(default_factory=_ScoreMemo, init=False, repr=False, compare=False)

    def run(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        endpoints: Sequence[Endpoint],
        *,
        trace: ProfileTrace | None = None,
        timer: PluginTimer | None = None,
        version: int | None = None,
    ) -> ProfileRunResult:
        """One scheduling cycle of this profile over `endpoints`; raises `SchedulingError`.

        `version` is the snapshot version `endpoints` came from (None: unknown, nothing is reused).
        """
        survivors = self._filter(request, cycle_state, endpoints, trace, timer)
        if trace is not None:
            totals = self._score_traced(request, cycle_state, survivors, trace, timer)
        else:
            totals = self._score(request, cycle_state, survivors, timer, version)
        scored = ScoredEndpoints(survivors, totals)
        cycle_state.write(scores_key(self.name), scored)  # what the front ends may report
        start = time.perf_counter() if timer is not None else 0.0
        result = self.picker.pick(request, cycle_state, scored)
        if timer is not None:
            timer.observe(PICKER, self.picker, time.perf_counter() - start)
        if trace is not None:
            trace.picker = str(self.picker.typed_name)
            trace.targets = [ep.name for ep in result.targets]
        if not result.targets:
            raise self._fault(SchedulingError, "picker", self.picker, "returned no endpoint")
        if not all(ep in survivors for ep in result.targets):  # identity: endpoints compare by id
            raise self._fault(SchedulingError, "picker", self.picker, "chose an endpoint it was not given")
        return result

    def _fault(self, kind: type[_E], role: str, plugin: Plugin, what: str) -> _E:
        """The error a plugin that broke its contract (or left nothing) ends this profile with."""
        name = str(plugin.typed_name)
        return kind(f"profile {self.name!r}: {role} {name} {what}", profile=self.name, plugin=name)

    def _filter(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        endpoints: Sequence[Endpoint],
        trace: ProfileTrace | None,
        timer: PluginTimer | None,
    ) -> Sequence[Endpoint]:
        current = endpoints
        for f in self.filters:
            start = time.perf_counter() if timer is not None else 0.0
            kept = f.filter(request, cycle_state, current)
            if timer is not None:
                timer.observe(FILTER, f, time.perf_counter() - start)
            if trace is not None:
                trace.filters.append(FilterStep(str(f.typed_name), [ep.name for ep in kept]))
            allowed = set(map(id, current))
            if not allowed.issuperset(map(id, kept)):
                raise self._fault(SchedulingError, "filter", f, "returned an endpoint it was not given")
            if not kept:
                raise self._fault(
                    EndpointsFilteredError, "filter", f, f"removed all {len(current)} endpoints"
                )
            current = kept
        return current

    def _score(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        endpoints: Sequence[Endpoint],
        timer: PluginTimer | None,
        version: int | None,
    ) -> list[float]:
        memo = self._memo
        if version is not None:
            memo.prepare(self.scorers, version, endpoints)
        start = 0
        totals = [0.0] * len(endpoints)
        lead = memo.lead_sum if version is not None else None
        if lead is not None:
            start, totals = memo.lead_count, lead
        for i in range(start, len(self.scorers)):
            ws = self.scorers[i]
            weight = ws.weight
            if version is not None and memo.cacheable[i]:
                weighted = memo.weighted[i]
                if weighted is None:
                    raw = self._call(ws, request, cycle_state, endpoints, timer)
                    weighted = [weight if s > 1.0 else (weight * s if s >= 0.0 else 0.0) for s in raw]
                    memo.weighted[i] = weighted
                totals = [t + w for t, w in zip(totals, weighted, strict=True)]
                if i == memo.lead_count - 1:
                    memo.lead_sum = totals
                continue
            raw = self._call(ws, request, cycle_state, endpoints, timer)
            # Clamp to [0, 1] and weigh in one pass; NaN fails both comparisons and adds 0.
            totals = [
                t + (weight if s > 1.0 else (weight * s if s >= 0.0 else 0.0))
                for t, s in zip(totals, raw, strict=True)
            ]
        # The picker gets a list of its own: the memo's must not change.
        return list(totals) if totals is memo.lead_sum else totals

    def _call(
        self,
        ws: WeightedScorer,
        request: InferenceRequest,
        cycle_state: CycleState,
        endpoints: Sequence[Endpoint],
        timer: PluginTimer | None,
    ) -> Sequence[float]:
        start = time.perf_counter() if timer is not None else 0.0
        raw = ws.scorer.score(request, cycle_state, endpoints)
        if timer is not None:
            timer.observe(SCORER, ws.scorer, time.perf_counter() - start)
        if len(raw) != len(endpoints):
            what = f"returned {len(raw)} scores for {len(endpoints)} endpoints"
            raise self._fault(SchedulingError, "scorer", ws.scorer, what)
        return raw

    def _score_traced(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        endpoints: Sequence[Endpoint],
        trace: ProfileTrace,
        timer: PluginTimer | None,
    ) -> list[float]:
        """As `_score`, calling every scorer and recording each one's clamped scores."""
        totals = [0.0] * len(endpoints)
        for ws in self.scorers:
            raw = self._call(ws, request, cycle_state, endpoints, timer)
            clamped = [1.0 if s > 1.0 else (s if s >= 0.0 else 0.0) for s in raw]
            totals = [t + ws.weight * s for t, s in zip(totals, clamped, strict=True)]
            names = {ep.name: s for ep, s in zip(endpoints, clamped, strict=True)}
            trace.scorers.append(ScorerStep(str(ws.scorer.typed_name), ws.weight, names))
        trace.totals = {ep.name: t for ep, t in zip(endpoints, totals, strict=True)}
        return totals
