"""`data-parallel-profile-handler` (llm-d): one profile over data-parallel ranks, each rank an endpoint
of its own (same pod IP, its own port), the request sent to the pod's primary port.

As upstream's (llm-d/llm-d-router,
pkg/epp/framework/plugins/scheduling/profilehandler/dataparallel/dp_profile_handler.go): it runs the
config's one profile; the chosen rank's `ip:port` goes to the model server in header
`x-data-parallel-host-port`, and the targets are the same endpoints on `primaryPort` (default 8000),
where the server's sidecar or vLLM's API server forwards to the rank. `primaryPort` is 1..65535 (0, as
upstream, keeps port 0). Upstream marks the type deprecated in favour of the plain handler with Istio
1.28.1 or later; it is kept for the configs that use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pydantic import Field

from epick.framework import (
    Endpoint,
    InferenceRequest,
    ProfileLike,
    ProfileRunResult,
    SchedulingError,
    SchedulingResult,
)
from epick.plugins.profile.one_round import OneRoundHandler
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "data-parallel-profile-handler"
DATA_PARALLEL_HEADER = "x-data-parallel-host-port"


class DataParallelParameters(Parameters):
    primary_port: int = Field(default=8000, ge=0, le=65535)


def on_port(endpoint: Endpoint, port: int) -> Endpoint:
    return dataclasses.replace(endpoint, port=port)


class DataParallelProfileHandler(OneRoundHandler):
    plugin_type = TYPE

    def __init__(self, name: str | None = None, primary_port: int = 8000) -> None:
        super().__init__(name)
        self.primary_port = primary_port

    def first_round(self, request: InferenceRequest, profiles: Mapping[str, ProfileLike]) -> list[str]:
        if len(profiles) != 1:
            raise SchedulingError(
                f"{TYPE} requires exactly one scheduling profile, the config has {len(profiles)}"
            )
        return list(profiles)

    def merge(
        self, request: InferenceRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        if len(results) != 1:
            raise SchedulingError(f"{TYPE} runs a single profile, got {len(results)} results")
        name, result = next(iter(results.items()))
        if result is None or not result.targets:
            raise SchedulingError(f"failed to run scheduler profile {name!r}", profile=name)
        rank = result.targets[0].host_port
        moved = ProfileRunResult(tuple(on_port(ep, self.primary_port) for ep in result.targets))
        return SchedulingResult({name: moved}, name, headers={DATA_PARALLEL_HEADER: rank})


def _factory(name: str, params: DataParallelParameters, handle: Handle) -> DataParallelProfileHandler:
    return DataParallelProfileHandler(name, params.primary_port)


SPEC = PluginSpec(TYPE, _factory, DataParallelParameters, "data-parallel ranks behind the pod's primary port")
