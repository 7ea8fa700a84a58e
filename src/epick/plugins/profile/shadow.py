"""`shadow-profile-handler`: run the primary profile, then shadow profiles whose results are only reported.

Use it to try a new profile on live traffic: the request goes where the primary profile says; each
shadow's choice lands in `SchedulingResult.shadow_results` and the debug log, for comparison.
Parameters: `primaryProfile` (default "default") and `shadowProfiles` (default: every other profile).
A failing shadow never fails the request.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from epick.framework import (
    InferenceRequest,
    ProfileLike,
    ProfileRunResult,
    SchedulingError,
    SchedulingResult,
)
from epick.plugins.profile.one_round import OneRoundHandler
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "shadow-profile-handler"
log = logging.getLogger(__name__)


class ShadowParameters(Parameters):
    primary_profile: str = "default"
    shadow_profiles: list[str] | None = None


class ShadowProfileHandler(OneRoundHandler):
    plugin_type = TYPE

    def __init__(self, name: str | None = None, primary: str = "default", shadows: list[str] | None = None):
        super().__init__(name)
        self.primary = primary
        self.shadows = shadows

    def required_profiles(self) -> dict[str, str]:
        need = {"primaryProfile": self.primary}
        for i, s in enumerate(self.shadows or []):
            need[f"shadowProfiles[{i}]"] = s
        return need

    def first_round(self, request: InferenceRequest, profiles: Mapping[str, ProfileLike]) -> list[str]:
        shadows = self.shadows if self.shadows is not None else list(profiles)
        # The primary runs once, first; a shadow listed twice runs once.
        return list(dict.fromkeys([self.primary, *shadows]))

    def merge(
        self, request: InferenceRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        primary = results.get(self.primary)
        if primary is None:
            raise SchedulingError(f"profile {self.primary!r} produced no result", profile=self.primary)
        shadows = {name: r for name, r in results.items() if name != self.primary}
        if log.isEnabledFor(logging.DEBUG):
            for name, r in shadows.items():
                log.debug(
                    "shadow profile result",
                    extra={
                        "request_id": request.request_id,
                        "profile": name,
                        "targets": [ep.name for ep in r.targets] if r else None,
                        "primary_targets": [ep.name for ep in primary.targets],
                    },
                )
        return SchedulingResult({self.primary: primary}, self.primary, shadow_results=shadows)


def _factory(name: str, params: ShadowParameters, handle: Handle) -> ShadowProfileHandler:
    return ShadowProfileHandler(name, params.primary_profile, params.shadow_profiles)


SPEC = PluginSpec(TYPE, _factory, ShadowParameters, "primary profile acted on, shadows reported")
