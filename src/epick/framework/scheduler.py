"""The scheduler: the one entry point of the scheduling subsystem. Not a plugin."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from epick.framework.cycle_state import CycleState
from epick.framework.endpoint import Endpoint
from epick.framework.errors import NoEndpointsError, SchedulingError
from epick.framework.interfaces import PluginTimer, ProfileHandler
from epick.framework.profile import SchedulerProfile
from epick.framework.request import InferenceRequest
from epick.framework.results import ProfileRunResult, SchedulingResult
from epick.framework.snapshot import Snapshot
from epick.framework.trace import ProfileTrace, ScheduleTrace


class Scheduler:
    """Runs profiles chosen by one profile handler and returns the handler's merged result.

    `schedule` is synchronous and pure CPU. It freezes the candidate list at the start (endpoints
    carry immutable metrics), so every profile and plugin of one call sees the same state even if
    the data layer moves on meanwhile.
    """

    def __init__(self, profiles: Mapping[str, SchedulerProfile], handler: ProfileHandler) -> None:
        if not profiles:
            raise ValueError("a scheduler needs at least one profile")
        for key, profile in profiles.items():
            if key != profile.name:
                raise ValueError(f"profile registered as {key!r} is named {profile.name!r}")
        self.profiles: dict[str, SchedulerProfile] = dict(profiles)
        self.handler = handler
        self.timer: PluginTimer | None = None  # set by the service to time every plugin call

    def schedule(
        self,
        request: InferenceRequest,
        candidates: Snapshot | Iterable[Endpoint],
        *,
        trace: ScheduleTrace | None = None,
        cycle_state: CycleState | None = None,
    ) -> SchedulingResult:
        """Schedule `request` on `candidates`: a versioned `Snapshot` (what the data layer gives, so
        scores that depend on metrics alone are computed once per version) or any endpoints.

        `cycle_state` is the call's scratch space; pass one to hand it on to the PreRequest hooks.
        """
        if isinstance(candidates, Snapshot):
            endpoints, version = candidates.endpoints, candidates.version
        else:
            endpoints, version = tuple(candidates), None
        try:
            result = self._schedule(request, endpoints, version, trace, cycle_state or CycleState())
        except SchedulingError as e:
            if trace is not None:
                trace.error = str(e)
            raise
        if trace is not None:
            trace.primary_profile = result.primary_profile
            trace.targets = [ep.name for ep in result.targets]
        return result

    def _schedule(
        self,
        request: InferenceRequest,
        snapshot: tuple[Endpoint, ...],
        version: int | None,
        trace: ScheduleTrace | None,
        cycle_state: CycleState,
    ) -> SchedulingResult:
        if not snapshot:
            raise NoEndpointsError("no candidate endpoints to schedule on")
        results: dict[str, ProfileRunResult | None] = {}
        failures: dict[str, SchedulingError] = {}
        while True:
            names = self.handler.pick_profiles(request, cycle_state, self.profiles, results)
            if not names:
                break
            for name in names:
                profile = self.profiles.get(name)
                if profile is None:
                    raise SchedulingError(
                        f"profile handler {self.handler.typed_name} picked unknown profile {name!r}",
                        plugin=str(self.handler.typed_name),
                    )
                if name in results:
                    # Each profile runs at most once per call; this also ends a handler that loops.
                    raise SchedulingError(
                        f"profile handler {self.handler.typed_name} picked profile {name!r} twice",
                        profile=name,
                        plugin=str(self.handler.typed_name),
                    )
                ptrace = None
                if trace is not None:
                    ptrace = ProfileTrace(name, candidates=[ep.name for ep in snapshot])
                    trace.profiles.append(ptrace)
                try:
                    results[name] = profile.run(
                        request, cycle_state, snapshot, trace=ptrace, timer=self.timer, version=version
                    )
                except SchedulingError as e:
                    results[name] = None
                    failures[name] = e
                    if ptrace is not None:
                        ptrace.error = str(e)
        if not results:
            raise SchedulingError(
                f"profile handler {self.handler.typed_name} picked no profile to run",
                plugin=str(self.handler.typed_name),
            )
        try:
            return self.handler.process_results(request, cycle_state, results)
        except SchedulingError as e:
            # A handler that rejects a failed profile gets that profile's own error, which names
            # the plugin at fault.
            if e.profile is not None and e.profile in failures:
                raise failures[e.profile] from None
            raise
