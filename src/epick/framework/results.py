"""What a profile run and a whole scheduling call produce."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, overload

from epick.framework.endpoint import Endpoint


class ScoredEndpoint(NamedTuple):
    """An endpoint with its weighted total score in the current profile run."""

    endpoint: Endpoint
    score: float


class ScoredEndpoints(Sequence[ScoredEndpoint]):
    """What the runtime hands a picker: the survivors with their totals, as a sequence of
    `ScoredEndpoint` built on access, and as the parallel lists `endpoints` and `scores` for pickers
    that would rather not build an object per endpoint."""

    __slots__ = ("endpoints", "scores")

    def __init__(self, endpoints: Sequence[Endpoint], scores: Sequence[float]) -> None:
        self.endpoints = endpoints
        self.scores = scores

    def __len__(self) -> int:
        return len(self.endpoints)

    @overload
    def __getitem__(self, i: int) -> ScoredEndpoint: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[ScoredEndpoint]: ...

    def __getitem__(self, i: int | slice) -> ScoredEndpoint | Sequence[ScoredEndpoint]:
        if isinstance(i, slice):
            return [ScoredEndpoint(e, s) for e, s in zip(self.endpoints[i], self.scores[i], strict=True)]
        return ScoredEndpoint(self.endpoints[i], self.scores[i])


def split_scored(scored: Sequence[ScoredEndpoint]) -> tuple[Sequence[Endpoint], Sequence[float]]:
    """(endpoints, scores) of a picker's input, without copying when the runtime built it."""
    if isinstance(scored, ScoredEndpoints):
        return scored.endpoints, scored.scores
    return [s.endpoint for s in scored], [s.score for s in scored]


@dataclass(frozen=True, slots=True)
class ProfileRunResult:
    """The picker's choice in one profile: primary first, the rest are fallbacks."""

    targets: tuple[Endpoint, ...]

    @property
    def primary(self) -> Endpoint:
        return self.targets[0]


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    """The outcome of `Scheduler.schedule`, built by the profile handler.

    `profile_results` holds every profile whose result the caller should act on (a failed run is
    None); a shadow profile's result is reported, not included.
    """

    profile_results: Mapping[str, ProfileRunResult | None]
    primary_profile: str
    # Results of profiles run only to be reported (shadow profiles); never acted on.
    shadow_results: Mapping[str, ProfileRunResult | None] = field(default_factory=dict)
    # The profile whose target computes the prompt when the decision disaggregates prefill from
    # decode (set by a P/D profile handler; `prefill` is its target).
    prefill_profile: str | None = None
    # Request headers the decision sets on the forwarded request beside the prefill header (e.g.
    # `x-encoder-hosts-ports`, `x-data-parallel-host-port`), set by the profile handler.
    headers: Mapping[str, str] = field(default_factory=dict)
    # Request headers PreRequest hooks add (upstream's PreRequest plugins write the request's
    # headers; e.g. `p2p-source-producer`'s `x-kv-cache-source-host-port`).
    hook_headers: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def forwarded_headers(self) -> Mapping[str, str]:
        """Every header the decision sets on the forwarded request but the prefill header."""
        return {**self.headers, **self.hook_headers} if self.hook_headers else self.headers

    @property
    def primary(self) -> ProfileRunResult:
        result = self.profile_results[self.primary_profile]
        assert result is not None, "a SchedulingResult's primary profile always has a result"
        return result

    @property
    def targets(self) -> tuple[Endpoint, ...]:
        """The primary profile's targets: where to send the request, then fallbacks."""
        return self.primary.targets

    @property
    def prefill(self) -> Endpoint | None:
        """The endpoint that prefills a disaggregated request (`x-prefiller-host-port`), if any: the
        prefill profile's target, when that profile ran beside the primary one."""
        name = self.prefill_profile
        if name is None or name == self.primary_profile:
            return None
        result = self.profile_results.get(name)
        return result.targets[0] if result is not None and result.targets else None
