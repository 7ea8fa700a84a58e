"""What a profile run and a whole scheduling call produce."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from epick.framework.endpoint import Endpoint


class ScoredEndpoint(NamedTuple):
    """An endpoint with its weighted total score in the current profile run."""

    endpoint: Endpoint
    score: float


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

    @property
    def primary(self) -> ProfileRunResult:
        result = self.profile_results[self.primary_profile]
        assert result is not None, "a SchedulingResult's primary profile always has a result"
        return result

    @property
    def targets(self) -> tuple[Endpoint, ...]:
        """The primary profile's targets: where to send the request, then fallbacks."""
        return self.primary.targets
