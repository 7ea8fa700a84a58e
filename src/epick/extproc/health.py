"""`grpc.health.v1.Health` (Check and Watch) on epick's gRPC server: what gateways and Kubernetes' gRPC
probes ask of the ext_proc and health ports. (The Go EPP answers Watch UNIMPLEMENTED; epick streams
each change.)"""

from __future__ import annotations

import logging
from collections.abc import Callable

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from epick.wire.grpc_call import Call, Method
from epick.wire.h2 import Status

log = logging.getLogger(__name__)

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"


def _answer(status: int) -> bytes:
    answer: bytes = health_pb2.HealthCheckResponse(status=status).SerializeToString()
    return answer


def _service(call: Call, message: bytes) -> str | None:
    try:
        service: str = health_pb2.HealthCheckRequest.FromString(message).service
        return service
    except DecodeError:
        call.finish(Status.INVALID_ARGUMENT, "not a grpc.health.v1.HealthCheckRequest")
        return None


EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"
# The services the Go EPP names with leader election on (cmd/epp/runner/health.go); without it every
# name, these and any other (GIE's charts probe "inference-extension"), gets the readiness answer.
KNOWN_SERVICES = ("", LIVENESS, READINESS, EXT_PROC)


class HealthService:
    """What the EPP's health server answers (llm-d-router `cmd/epp/runner/health.go`), from a few facts
    the service keeps up to date:

    - `synced`: the endpoints are known (the pool has been listed; a static list always is);
    - `leader`: None without leader election, else whether this replica holds the Lease;
    - `draining`: stopping (SIGTERM); every readiness answer turns NOT_SERVING at once;
    - `not_ready`: why the service cannot serve although synced (a pool protocol no parser takes), or
      None;
    - `plugins`: why a plugin is not ready (upstream's `ReadinessChecker`), or None; `probe`, when set,
      gives it afresh at each check (`refresh`).

    Ready is all four agreeing. Without leader election every service name gets the ready answer, except
    `liveness`, which is SERVING while the process runs (the Go EPP fails it too while unsynced or
    draining: a pod waiting for its pool is alive, and restarting it fixes nothing). With leader
    election `liveness` is SERVING, `readiness`, `""` and the ext_proc service are the ready answer, and
    any other name is SERVICE_UNKNOWN, as upstream's. Each change of the answer is logged once, with why.
    """

    def __init__(self) -> None:
        self.synced = True
        self.leader: bool | None = None
        self.draining = False
        self.not_ready: str | None = None
        self.plugins: str | None = None
        self.probe: Callable[[], str | None] | None = None
        self._watchers: dict[str, set[_Watch]] = {}
        self._said: str | None = None

    @property
    def ready(self) -> bool:
        return (
            self.synced
            and self.leader is not False
            and not self.draining
            and self.not_ready is None
            and self.plugins is None
        )

    def why_not_ready(self) -> str | None:
        """Why readiness is NOT_SERVING, in words (None when ready)."""
        reasons = []
        if not self.synced:
            reasons.append("the endpoints are not known yet (the pool has not been listed)")
        if self.leader is False:
            reasons.append("another replica holds the leader Lease")
        if self.draining:
            reasons.append("draining for shutdown")
        if self.not_ready is not None:
            reasons.append(self.not_ready)
        if self.plugins is not None:
            reasons.append(self.plugins)
        return "; ".join(reasons) or None

    def refresh(self) -> None:
        """Ask `probe` whether the plugins are ready; a change is logged and told like any other."""
        if self.probe is not None:
            plugins = self.probe()
            if plugins != self.plugins:
                self.update(plugins=plugins)

    def status(self, service: str) -> int:
        """The answer for `service`, the plugins asked afresh."""
        if service != LIVENESS:
            self.refresh()
        return self._status(service)

    def _status(self, service: str) -> int:
        if service == LIVENESS:
            return SERVING
        if self.leader is not None and service not in KNOWN_SERVICES:
            return SERVICE_UNKNOWN
        return SERVING if self.ready else NOT_SERVING

    def update(self, **facts: object) -> None:
        """Set some of the facts (synced, leader, draining, not_ready, plugins), log a change of
        readiness, and tell those watching."""
        for name, value in facts.items():
            if name not in ("synced", "leader", "draining", "not_ready", "plugins"):
                raise TypeError(f"unknown health fact {name!r}")
            setattr(self, name, value)
        said = self.why_not_ready()
        if said != self._said:
            if said is None:
                log.info("ready: serving")
            elif self.draining:
                log.info("not ready: %s", said)  # stopping, as asked
            else:
                log.warning("not ready: %s", said)
            self._said = said
        for service, watches in self._watchers.items():
            status = self._status(service)
            for watch in list(watches):
                watch.tell(status)

    def methods(self) -> dict[str, Method]:
        return {CHECK: lambda call: _Check(self, call), WATCH: lambda call: _Watch(self, call)}


class _Check:
    def __init__(self, health: HealthService, call: Call) -> None:
        self.health = health
        self.call = call
        self.service: str | None = None

    def received(self, message: bytes) -> None:
        if self.service is not None:
            self.call.finish(Status.INVALID_ARGUMENT, "Check takes one request")
            return
        self.service = _service(self.call, message)

    def ended(self) -> None:
        if self.service is None:
            self.call.finish(Status.INVALID_ARGUMENT, "Check takes one request; none came")
            return
        self.call.send(_answer(self.health.status(self.service)))
        self.call.finish()

    def cancelled(self) -> None:
        pass


class _Watch:
    def __init__(self, health: HealthService, call: Call) -> None:
        self.health = health
        self.call = call
        self.service: str | None = None
        self.last: int | None = None

    def received(self, message: bytes) -> None:
        if self.service is not None:
            self.call.finish(Status.INVALID_ARGUMENT, "Watch takes one request")
            self.cancelled()
            return
        service = _service(self.call, message)
        if service is None:
            return
        self.service = service
        self.health._watchers.setdefault(service, set()).add(self)
        self.tell(self.health.status(service))

    def tell(self, status: int) -> None:
        if status != self.last:
            self.last = status
            self.call.send(_answer(status))

    def ended(self) -> None:
        pass  # a server-streaming call: the client's half-close after its request changes nothing

    def cancelled(self) -> None:
        if self.service is not None:
            watchers = self.health._watchers.get(self.service)
            if watchers is not None:
                watchers.discard(self)
