"""Tenants and priorities on any workload: who sends each request (its fairness id) and how urgent it
is (its objective's priority), for flow control to share and order.

`tenants=N` spreads the sessions (a request without a session is its own) over tenants `t0`…, in
proportion to `tenant-weights` (default: equal); `priorities=10:0.2,0:0.5,-10:0.3` gives each
priority its share of the sessions (default: all 0). Every turn of a session keeps its tenant and
priority. The draws come from their own stream, seeded from the run's, so the requests themselves
are the same as without tenancy.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from epick.simulate.types import SimRequestSpec
from epick.simulate.workloads.base import Workload, WorkloadError

TENANCY_PARAMS = ("tenants", "tenant-weights", "priorities")


@dataclass(frozen=True, slots=True)
class Tenancy:
    tenants: int = 1
    weights: tuple[float, ...] = ()
    priorities: tuple[tuple[int, float], ...] = ((0, 1.0),)

    @classmethod
    def parse(cls, params: dict[str, str | int | float]) -> Tenancy | None:
        """Take the tenancy parameters out of `params` (None when none is given)."""
        given = {k: params.pop(k) for k in TENANCY_PARAMS if k in params}
        if not given:
            return None
        try:
            tenants = int(given.get("tenants", 1))
        except ValueError:
            raise WorkloadError(f"tenants must be an integer, got {given['tenants']!r}") from None
        if tenants < 1:
            raise WorkloadError(f"tenants must be at least 1, got {tenants}")
        weights: tuple[float, ...] = ()
        if "tenant-weights" in given:
            try:
                weights = tuple(float(w) for w in str(given["tenant-weights"]).split(","))
            except ValueError:
                raise WorkloadError(
                    f"tenant-weights must be numbers separated by commas, got {given['tenant-weights']!r}"
                ) from None
            if len(weights) != tenants or any(w <= 0 for w in weights):
                raise WorkloadError(f"tenant-weights needs {tenants} positive numbers (one per tenant)")
        priorities: tuple[tuple[int, float], ...] = ((0, 1.0),)
        if "priorities" in given:
            pairs = []
            for part in str(given["priorities"]).split(","):
                level, sep, share = part.partition(":")
                try:
                    pairs.append((int(level), float(share)))
                except ValueError:
                    raise WorkloadError(
                        f"priorities must be PRIORITY:SHARE pairs separated by commas (e.g. '10:0.2,0:0.8'), "
                        f"got {part!r}"
                    ) from None
                if not sep or pairs[-1][1] < 0:
                    raise WorkloadError(f"priorities: {part!r} needs a share >= 0 after ':'")
            if not sum(s for _, s in pairs) > 0:
                raise WorkloadError("priorities: the shares must not all be 0")
            priorities = tuple(pairs)
        return cls(tenants, weights, priorities)


@dataclass(slots=True)
class TenantWorkload:
    """`inner`'s requests, each with a tenant and a priority (by session)."""

    inner: Workload
    tenancy: Tenancy
    kind: ClassVar[str] = "tenants"
    _assigned: dict[str, tuple[str, int]] = field(default_factory=dict)

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        # Its own stream, seeded from the run's state without drawing from it.
        draws = random.Random(sum(rng.getstate()[1][:16]) * 31 + 7)
        t = self.tenancy
        names = [f"t{i}" for i in range(t.tenants)]
        weights = list(t.weights) or None
        levels = [p for p, _ in t.priorities]
        shares = [s for _, s in t.priorities]
        for spec in self.inner.requests(rng):
            key = spec.session or spec.request_id
            assigned = self._assigned.get(key)
            if assigned is None:
                assigned = (draws.choices(names, weights)[0], draws.choices(levels, shares)[0])
                if spec.session:
                    self._assigned[key] = assigned
            spec.tenant, spec.priority = assigned
            yield spec

    def output_plan(self, request: SimRequestSpec) -> tuple[int, ...]:
        return self.inner.output_plan(request)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return self.inner.adapter_names

    @property
    def size(self) -> int | None:
        return self.inner.size

    @property
    def size_parameters(self) -> dict[str, int]:
        return self.inner.size_parameters

    @property
    def reuses_outputs(self) -> bool:
        return self.inner.reuses_outputs
