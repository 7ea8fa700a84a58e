"""An optional record of every step of a scheduling call, for `epick explain` and debugging."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class FilterStep:
    plugin: str  # name/type
    kept: list[str]  # endpoint names


@dataclass(slots=True)
class ScorerStep:
    plugin: str
    weight: float
    scores: dict[str, float]  # endpoint name -> clamped score


@dataclass(slots=True)
class ProfileTrace:
    name: str
    candidates: list[str] = field(default_factory=list)
    filters: list[FilterStep] = field(default_factory=list)
    scorers: list[ScorerStep] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    picker: str = ""
    targets: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class ScheduleTrace:
    """Filled in by `Scheduler.schedule(..., trace=...)`: profiles in the order they ran."""

    profiles: list[ProfileTrace] = field(default_factory=list)
    primary_profile: str | None = None
    targets: list[str] = field(default_factory=list)
    error: str | None = None
