"""Active-passive high availability: leader election on a `coordination.k8s.io/v1` Lease, as client-go's
`leaderelection` package does it (the Go EPP's `--ha-enable-leader-election`).

Each replica runs a `LeaderElector`. The holder renews the Lease every `retry_period`; a replica that
sees the same record unchanged for `lease_duration` (measured on its own clock, from when it last saw
the record change, so that clocks need not agree) takes it over, bumping `leaseTransitions`. Writes
carry the resourceVersion read, so of two replicas that try at once, one gets 409 Conflict and stays a
candidate. A leader that cannot renew within `renew_deadline` stops leading; on `stop()` a leader
releases the Lease (empty holder, one-second duration) so that a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from epick.datalayer.discovery.kubernetes.api import Json, _ApiError, _describe, call_json

__all__ = ["LeaderElector", "LeaseSettings", "default_identity"]

log = logging.getLogger("epick.leader")

GROUP, VERSION, PLURAL = "coordination.k8s.io", "v1", "leases"


def default_identity() -> str:
    """The holder identity controller-runtime uses: the host name, an underscore and a fresh UUID."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


# client-go's leaderelection JitterFactor: the renew deadline must exceed it times the retry period
JITTER_FACTOR = 1.2


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Which Lease, and controller-runtime's timings (15 s, 10 s, 2 s)."""

    name: str
    namespace: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str = ""  # empty: `default_identity()`

    def check(self) -> None:
        if not self.name or not self.namespace:
            raise ValueError("leader election needs the Lease's name and namespace")
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "leader election: the lease duration must exceed the renew deadline, which must exceed "
                f"the retry period (got {self.lease_duration}s, {self.renew_deadline}s, {self.retry_period}s)"
            )
        if not self.renew_deadline > JITTER_FACTOR * self.retry_period:
            raise ValueError(
                f"leader election: the renew deadline must exceed {JITTER_FACTOR} x the retry period "
                f"(got {self.renew_deadline}s and {self.retry_period}s)"
            )


def _micro_time(moment: float) -> str:
    """A MicroTime as the API server writes it: RFC 3339 with microseconds, in UTC."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for a Lease until stopped; `leading` says whether this replica holds it now, and
    `on_change` is told each time that changes."""

    def __init__(
        self,
        api_client: Any,
        settings: LeaseSettings,
        on_change: Callable[[bool], None] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        settings.check()
        self._api = api_client
        self.settings = settings
        self.identity = settings.identity or default_identity()
        self._on_change = on_change
        self._clock = clock
        self._wall = wall
        self.leading = False
        self._observed: Json | None = None  # the last record read (the Lease's spec)
        self._observed_at = 0.0  # when it last changed, on this replica's clock
        self._resource_version: str | None = None
        self._last_renew = 0.0
        self._task: asyncio.Task[None] | None = None
        # Each call to the API server, as client-go's: half the renew deadline, at least a second.
        self._timeout = max(settings.renew_deadline / 2, 1.0)

    @property
    def holder(self) -> str:
        """Who holds the Lease as last read ("" when nobody)."""
        return str((self._observed or {}).get("holderIdentity") or "")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._campaign(), name="leader election")

    async def stop(self) -> None:
        """Stop campaigning; a leader releases the Lease."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.leading:
            await self._release()
            self._set_leading(False)

    # --- the loop --------------------------------------------------------------------------------

    async def _campaign(self) -> None:
        retry = self.settings.retry_period
        while True:
            # A leader's attempt may take only what is left of its renew deadline (client-go bounds
            # its renewal the same way): past it, it must stop leading before a standby can take over.
            left = self.settings.renew_deadline - (self._clock() - self._last_renew)
            budget = max(left, 0.0) if self.leading else None
            try:
                async with asyncio.timeout(budget):
                    held = await self._try_acquire_or_renew()
            except (_ApiError, OSError, TimeoutError, ValueError) as e:
                held = False
                log.warning("Lease %s: %s", self._where, _describe(e))
            except Exception as e:  # aiohttp's errors and the like: keep campaigning
                held = False
                log.warning("Lease %s: %s", self._where, _describe(e))
            now = self._clock()
            if held:
                self._last_renew = now
                self._set_leading(True)
            elif self.leading and self.holder not in ("", self.identity):
                log.error("Lease %s: taken over by %s", self._where, self.holder)
                self._set_leading(False)
            elif self.leading and now - self._last_renew >= self.settings.renew_deadline:
                log.error(
                    "Lease %s: not renewed within %gs; no longer leading",
                    self._where,
                    self.settings.renew_deadline,
                )
                self._set_leading(False)
            await asyncio.sleep(retry)

    @property
    def _where(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"

    def _set_leading(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        if leading:
            log.info("Lease %s: acquired as %s; now leading", self._where, self.identity)
        else:
            log.info("Lease %s: %s stopped leading", self._where, self.identity)
        if self._on_change is not None:
            self._on_change(leading)

    async def _try_acquire_or_renew(self) -> bool:
        from kubernetes_asyncio import client

        api = client.CustomObjectsApi(self._api)
        s = self.settings
        now = self._wall()
        try:
            lease = await self._read(api)
        except _ApiError as e:
            if e.status != 404:
                raise
            record = self._record(now, acquired=now, transitions=0)
            created = await call_json(
                api.create_namespaced_custom_object,
                GROUP,
                VERSION,
                s.namespace,
                PLURAL,
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Lease",
                    "metadata": {"name": s.name, "namespace": s.namespace},
                    "spec": record,
                },
                timeout=self._timeout,
            )
            self._observe(created)
            return True
        spec = self._observe(lease)
        holder = str(spec.get("holderIdentity") or "")
        if holder and holder != self.identity and self._clock() - self._observed_at < self._duration(spec):
            return False  # held by another, and renewed recently enough
        ours = holder == self.identity
        record = self._record(
            now,
            acquired=None if ours else now,
            transitions=int(spec.get("leaseTransitions") or 0) + (0 if ours else 1),
            previous=spec,
        )
        lease["spec"] = record
        updated = await call_json(
            api.replace_namespaced_custom_object,
            GROUP,
            VERSION,
            s.namespace,
            PLURAL,
            s.name,
            lease,
            timeout=self._timeout,
        )
        self._observe(updated)
        return True

    async def _read(self, api: Any) -> Json:
        s = self.settings
        return await call_json(
            api.get_namespaced_custom_object,
            GROUP,
            VERSION,
            s.namespace,
            PLURAL,
            s.name,
            timeout=self._timeout,
        )

    async def _write(self, api: Any, lease: Json) -> Json:
        """Replace the Lease (carrying the resourceVersion read: 409 if another wrote since)."""
        s = self.settings
        return await call_json(
            api.replace_namespaced_custom_object,
            GROUP,
            VERSION,
            s.namespace,
            PLURAL,
            s.name,
            lease,
            timeout=self._timeout,
        )

    def _duration(self, spec: Json) -> float:
        with contextlib.suppress(TypeError, ValueError):
            return float(spec.get("leaseDurationSeconds"))  # type: ignore[arg-type]
        return self.settings.lease_duration

    def _record(
        self, now: float, *, acquired: float | None, transitions: int, previous: Json | None = None
    ) -> Json:
        record: Json = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.settings.lease_duration)),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }
        if acquired is not None:
            record["acquireTime"] = _micro_time(acquired)
        elif previous is not None and previous.get("acquireTime"):
            record["acquireTime"] = previous["acquireTime"]
        return record

    def _observe(self, lease: Json) -> Json:
        spec = lease.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self._clock()
        self._resource_version = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        return spec

    async def _release(self) -> None:
        """Give the Lease up: an empty holder and a one-second duration (a standby takes it at once)."""
        from kubernetes_asyncio import client

        api = client.CustomObjectsApi(self._api)
        try:
            lease = await self._read(api)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            now = _micro_time(self._wall())
            lease["spec"] = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            }
            await self._write(api, lease)
            log.info("Lease %s: released", self._where)
        except Exception as e:  # shutting down: say so and go on
            log.warning("Lease %s: could not release it: %s", self._where, _describe(e))
