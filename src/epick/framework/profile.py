"""A scheduler profile and the runtime of one profile run: filter, score, pick."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from epick.framework.cycle_state import CycleState
from epick.framework.endpoint import Endpoint
from epick.framework.errors import EndpointsFilteredError, SchedulingError
from epick.framework.interfaces import Filter, Picker, Scorer
from epick.framework.request import InferenceRequest
from epick.framework.results import ProfileRunResult, ScoredEndpoint
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

    def run(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        endpoints: Sequence[Endpoint],
        trace: ProfileTrace | None = None,
    ) -> ProfileRunResult:
        """One scheduling cycle of this profile over `endpoints`; raises `SchedulingError`."""
        survivors = self._filter(request, cycle_state, endpoints, trace)
        totals = self._score(request, cycle_state, survivors, trace)
        scored = [ScoredEndpoint(ep, total) for ep, total in zip(survivors, totals, strict=True)]
        result = self.picker.pick(request, cycle_state, scored)
        if trace is not None:
            trace.picker = str(self.picker.typed_name)
            trace.targets = [ep.name for ep in result.targets]
        if not result.targets:
            raise SchedulingError(
                f"profile {self.name!r}: picker {self.picker.typed_name} returned no endpoint",
                profile=self.name,
                plugin=str(self.picker.typed_name),
            )
        allowed = {id(ep) for ep in survivors}
        if any(id(ep) not in allowed for ep in result.targets):
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
    ) -> Sequence[Endpoint]:
        current = endpoints
        for f in self.filters:
            kept = f.filter(request, cycle_state, current)
            if trace is not None:
                trace.filters.append(FilterStep(str(f.typed_name), [ep.name for ep in kept]))
            allowed = {id(ep) for ep in current}
            if any(id(ep) not in allowed for ep in kept):
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
    ) -> list[float]:
        totals = [0.0] * len(endpoints)
        for ws in self.scorers:
            raw = ws.scorer.score(request, cycle_state, endpoints)
            if len(raw) != len(endpoints):
                raise SchedulingError(
                    f"profile {self.name!r}: scorer {ws.scorer.typed_name} returned {len(raw)} scores "
                    f"for {len(endpoints)} endpoints",
                    profile=self.name,
                    plugin=str(ws.scorer.typed_name),
                )
            clamped = [_clamp(s) for s in raw]
            weight = ws.weight
            for i, s in enumerate(clamped):
                totals[i] += weight * s
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


def _clamp(score: float) -> float:
    if score > 1.0:
        return 1.0
    if score >= 0.0:
        return float(score)
    return 0.0  # negative or NaN
