"""`single-profile-handler`: run the one profile; its result is the result."""

from __future__ import annotations

from collections.abc import Mapping

from epick.framework import (
    InferenceRequest,
    ProfileLike,
    ProfileRunResult,
    SchedulingError,
    SchedulingResult,
)
from epick.plugins.profile.one_round import OneRoundHandler
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "single-profile-handler"


class SingleProfileHandler(OneRoundHandler):
    """Needs exactly one profile (the config loader enforces it)."""

    plugin_type = TYPE

    def first_round(self, request: InferenceRequest, profiles: Mapping[str, ProfileLike]) -> list[str]:
        return list(profiles)[:1]

    def merge(
        self, request: InferenceRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        name, result = next(iter(results.items()))
        if result is None:
            raise SchedulingError(f"profile {name!r} produced no result", profile=name)
        return SchedulingResult({name: result}, name)


def _factory(name: str, params: NoParameters, handle: Handle) -> SingleProfileHandler:
    return SingleProfileHandler(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "run the one profile")
