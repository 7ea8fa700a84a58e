"""`header-profile-handler` (llm-d): the request's header names the one profile to run.

As upstream's (llm-d/llm-d-router,
pkg/epp/framework/plugins/scheduling/profilehandler/headerprofile/header_profile_handler.go):
`headerName` (default `EPP-Profile`, matched case-insensitively) names the profile; without the
header, `defaultProfile` (default `decode`). With one profile configured, it always runs. A name that
is not a profile of the config fails the request, naming the header's value.
"""

from __future__ import annotations

from collections.abc import Mapping

from epick.framework import (
    InferenceRequest,
    ProfileLike,
    ProfileRunResult,
    Reads,
    SchedulingError,
    SchedulingResult,
)
from epick.plugins.profile.one_round import OneRoundHandler
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "header-profile-handler"


class HeaderProfileParameters(Parameters):
    header_name: str = "EPP-Profile"
    default_profile: str = "decode"


class HeaderProfileHandler(OneRoundHandler):
    plugin_type = TYPE
    reads = Reads.HEADERS

    def __init__(
        self, name: str | None = None, header_name: str = "EPP-Profile", default_profile: str = "decode"
    ):
        super().__init__(name)
        self.header_name = header_name.strip().lower()
        self.default_profile = default_profile.strip()

    def first_round(self, request: InferenceRequest, profiles: Mapping[str, ProfileLike]) -> list[str]:
        if len(profiles) == 1:
            return list(profiles)
        given = request.headers.get(self.header_name, "").strip()
        name = given or self.default_profile
        if name in profiles:
            return [name]
        if given:
            raise SchedulingError(
                f"header profile handler: no scheduling profile configured for {self.header_name!r} "
                f"header value {given!r} (profiles: {', '.join(profiles)})"
            )
        raise SchedulingError(
            f"header profile handler: defaultProfile {self.default_profile!r} is not a configured scheduling "
            f"profile, and the request has no {self.header_name!r} header"
        )

    def merge(
        self, request: InferenceRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        if len(results) != 1:
            raise SchedulingError(
                f"header profile handler runs a single profile per request, got {len(results)}"
            )
        name, result = next(iter(results.items()))
        if result is None:
            raise SchedulingError(f"failed to run scheduler profile {name!r}", profile=name)
        return SchedulingResult({name: result}, name)


def _factory(name: str, params: HeaderProfileParameters, handle: Handle) -> HeaderProfileHandler:
    return HeaderProfileHandler(name, params.header_name, params.default_profile)


SPEC = PluginSpec(TYPE, _factory, HeaderProfileParameters, "the profile a request header names")
