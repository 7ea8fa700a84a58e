"""A profile handler that picks all its profiles at once: a first round, and no second."""

from __future__ import annotations

from collections.abc import Mapping

from epick.framework import (
    CycleState,
    InferenceRequest,
    NamedPlugin,
    ProfileLike,
    ProfileRunResult,
    Reads,
    SchedulingResult,
)


class OneRoundHandler(NamedPlugin):
    """The handlers of single, header, shadow and data-parallel scheduling: `first_round` names the
    profiles to run; once they ran, nothing more does."""

    reads = Reads.NOTHING

    def pick_profiles(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        profiles: Mapping[str, ProfileLike],
        results: Mapping[str, ProfileRunResult | None],
    ) -> list[str]:
        return [] if results else self.first_round(request, profiles)

    def first_round(self, request: InferenceRequest, profiles: Mapping[str, ProfileLike]) -> list[str]:
        """The profiles to run, in order."""
        raise NotImplementedError

    def process_results(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        return self.merge(request, results)

    def merge(
        self, request: InferenceRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        """The scheduling result of the profiles' results (`SchedulingError` when there is none)."""
        raise NotImplementedError
