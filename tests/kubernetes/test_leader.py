"""Leader election on a Lease, against the API double, with the real kubernetes-asyncio client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from epick.service.leader import LeaderElector, LeaseSettings
from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.test_discovery import eventually

FAST = LeaseSettings("pool-epp", "default", lease_duration=0.6, renew_deadline=0.4, retry_period=0.05)


def elector(api: Any, identity: str, changes: list[tuple[str, bool]] | None = None) -> LeaderElector:
    settings = LeaseSettings(**{**_fields(FAST), "identity": identity})
    return LeaderElector(
        api, settings, (lambda leading: changes.append((identity, leading))) if changes is not None else None
    )


def _fields(s: LeaseSettings) -> dict[str, Any]:
    return {f: getattr(s, f) for f in s.__slots__}  # type: ignore[attr-defined]


async def test_one_leads_the_other_waits_and_takes_over_on_release(fake: FakeApiServer, api: Any) -> None:
    changes: list[tuple[str, bool]] = []
    a, b = elector(api, "a", changes), elector(api, "b", changes)
    a.start()
    await eventually(lambda: a.leading, lambda: changes)
    b.start()
    await eventually(lambda: b.holder == "a", lambda: b.holder)
    await asyncio.sleep(0.2)  # b keeps seeing a renew: it stays a candidate
    assert not b.leading
    lease = fake.lease("pool-epp")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 1
    assert lease["spec"]["renewTime"].endswith("Z")
    await a.stop()  # released: b need not wait out the lease
    released = fake.lease("pool-epp")
    assert released is not None
    await eventually(lambda: b.leading, lambda: (changes, fake.lease("pool-epp")))
    assert changes == [("a", True), ("a", False), ("b", True)]
    lease = fake.lease("pool-epp")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    await b.stop()


async def test_a_standby_takes_over_a_lease_that_stops_being_renewed(fake: FakeApiServer, api: Any) -> None:
    a, b = elector(api, "a"), elector(api, "b")
    a.start()
    await eventually(lambda: a.leading, lambda: fake.lease("pool-epp"))
    b.start()
    await eventually(lambda: b.holder == "a", lambda: b.holder)
    assert a._task is not None
    a._task.cancel()  # a stops renewing without releasing, as a killed process does
    loop = asyncio.get_running_loop()
    since = loop.time()
    await eventually(lambda: b.leading, lambda: fake.lease("pool-epp"), timeout=5)
    waited = loop.time() - since
    assert waited >= FAST.lease_duration * 0.8  # it waited for the lease to run out
    await b.stop()


async def test_a_leader_that_cannot_renew_stops_leading(fake: FakeApiServer, api: Any) -> None:
    changes: list[tuple[str, bool]] = []
    a = elector(api, "a", changes)
    a.start()
    await eventually(lambda: a.leading, lambda: changes)
    fake.fail_next(1000, status=500)
    await eventually(lambda: not a.leading, lambda: changes)
    fake.fail_next(0)
    fake._failures.clear()
    await eventually(lambda: a.leading, lambda: changes)
    assert changes == [("a", True), ("a", False), ("a", True)]
    await a.stop()


def test_timings_must_nest() -> None:
    with pytest.raises(ValueError, match="lease duration must exceed the renew deadline"):
        LeaseSettings("x", "default", lease_duration=5, renew_deadline=10, retry_period=2).check()
