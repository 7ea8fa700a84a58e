"""`grpc.health.v1.Health` (Check and Watch) on epick's gRPC server: what gateways and Kubernetes' gRPC
probes ask of the ext_proc and health ports."""

from __future__ import annotations

import logging

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from epick.wire.grpc_call import Call, Method
from epick.wire.h2 import Status

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
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


class HealthService:
    """Each service's status, as `grpc_health`'s servicer keeps it; "" is the server as a whole."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._watchers: dict[str, set[_Watch]] = {}

    def status(self, service: str) -> int | None:
        return self._status.get(service)

    def set(self, service: str, status: int) -> None:
        """Set a service's status and tell those watching it."""
        self._status[service] = status
        for watch in list(self._watchers.get(service, ())):
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
        status = self.health.status(self.service)
        if status is None:
            self.call.finish(Status.NOT_FOUND, f"unknown service {self.service!r}")
            return
        self.call.send(_answer(status))
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
        status = self.health.status(service)
        self.tell(SERVICE_UNKNOWN if status is None else status)

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
