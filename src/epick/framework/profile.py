"""A scheduler profile and the runtime of one profile run: filter, score, pick."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from epick.framework.cycle_state import CycleState
from epick.framework.endpoint import Endpoint
from epick.framework.errors import EndpointsFilteredError, SchedulingError
from epick.framework.interfaces import FILTER, PICKER, SCORER, Filter, Picker, PluginTimer, Scorer
from epick.framework.request import InferenceRequest
from epick.framework.results import ProfileRunResult, ScoredEndpoints
from epick.framework.trace import FilterStep, ProfileTrace, ScorerStep


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"scorer {self.scorer.typed_name}: weight must be a finite number >= 0")


@dataclass(slots=True)
class SchedulerProfile:
    """Filters (run in order), weighted scorers, and exactly one picker.

    A profile without scorers is valid: every survivor then has total 0 and the picker decides.
    """

    name: str
    picker: Picker
    filters: list[Filter] = field(default_factory=list)
    scorers: list[WeightedScorer] = field(default_factory=list)
    # The weighted totals after each scorer in the last call, and the scores each scorer returned.
    # Scorers that score a snapshot once return the same tuple for the next request on that snapshot
    # (epick.plugins.scorers.snapshot_memo); while the leading scorers do, their sums are reused.
    _sums: list[list[float]] = field(default_factory=list, init=False, repr=False, compare=False)
    _sums_of: list[object] = field(default_factory=list, init=False, repr=False, compare=False)

    def run(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        endpoints: Sequence[Endpoint],
        trace: ProfileTrace | None = None,
        timer: PluginTimer | None = None,
    ) -> ProfileRunResult:
        """One scheduling cycle of this profile over `endpoints`; raises `SchedulingError`."""
        survivors = self._filter(request, cycle_state, endpoints, trace, timer)
        totals = self._score(request, cycle_state, survivors, trace, timer)
        scored = ScoredEndpoints(survivors, totals)
        start = time.perf_counter() if timer is not None else 0.0
        result = self.picker.pick(request, cycle_state, scored)
        if timer is not None:
            timer.observe(PICKER, self.picker, time.perf_counter() - start)
        if trace is not None:
            trace.picker = str(self.picker.typed_name)
            trace.targets = [ep.name for ep in result.targets]
        if not result.targets:
            raise SchedulingError(
                f"profile {self.name!r}: picker {self.picker.typed_name} returned no endpoint",
                profile=self.name,
                plugin=str(self.picker.typed_name),
            )
        if not all(ep in survivors for ep in result.targets):  # identity: endpoints compare by id
            raise SchedulingError(
                f"profile {self.name!r}: picker {self.picker.typed_name} chose an endpoint it was not given",
                profile=self.name,
                plugin=str(self.picker.typed_name),
            )
        return result

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
                raise SchedulingError(
                    f"profile {self.name!r}: filter {f.typed_name} returned an endpoint it was not given",
                    profile=self.name,
                    plugin=str(f.typed_name),
                )
            if not kept:
                raise EndpointsFilteredError(
                    f"profile {self.name!r}: filter {f.typed_name} removed all {len(current)} endpoints",
                    profile=self.name,
                    plugin=str(f.typed_name),
                )
            current = kept
        return current

    def _score(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        endpoints: Sequence[Endpoint],
        trace: ProfileTrace | None,
        timer: PluginTimer | None,
    ) -> list[float]:
        totals = [0.0] * len(endpoints)
        if not self.scorers:
            if trace is not None:
                trace.totals = dict.fromkeys((ep.name for ep in endpoints), 0.0)
            return totals
        sums, sums_of = self._sums, self._sums_of
        if len(sums) != len(self.scorers):
            sums[:] = [totals] * len(self.scorers)
            sums_of[:] = [None] * len(self.scorers)
        reusing = trace is None
        for i, ws in enumerate(self.scorers):
            start = time.perf_counter() if timer is not None else 0.0
            raw = ws.scorer.score(request, cycle_state, endpoints)
            if timer is not None:
                timer.observe(SCORER, ws.scorer, time.perf_counter() - start)
            if len(raw) != len(endpoints):
                raise SchedulingError(
                    f"profile {self.name!r}: scorer {ws.scorer.typed_name} returned {len(raw)} scores "
                    f"for {len(endpoints)} endpoints",
                    profile=self.name,
                    plugin=str(ws.scorer.typed_name),
                )
            weight = ws.weight
            if trace is None:
                if reusing and raw is sums_of[i] and type(raw) is tuple:
                    totals = sums[i]  # the same immutable scores after the same sums: the same sum
                    continue
                reusing = False
                # Clamp to [0, 1] and weigh in one pass; NaN fails both comparisons and adds 0.
                totals = [
                    t + (weight if s > 1.0 else (weight * s if s >= 0.0 else 0.0))
                    for t, s in zip(totals, raw, strict=True)
                ]
                sums[i], sums_of[i] = totals, raw
                continue
            clamped = [1.0 if s > 1.0 else (s if s >= 0.0 else 0.0) for s in raw]
            totals = [t + weight * s for t, s in zip(totals, clamped, strict=True)]
            if trace is not None:
                trace.scorers.append(
                    ScorerStep(
                        str(ws.scorer.typed_name),
                        weight,
                        {ep.name: s for ep, s in zip(endpoints, clamped, strict=True)},
                    )
                )
        if trace is not None:
            trace.totals = {ep.name: t for ep, t in zip(endpoints, totals, strict=True)}
            return totals
        return list(totals)  # the picker gets its own list: the one kept in `_sums` must not change
