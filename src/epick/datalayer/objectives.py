"""InferenceObjectives: the priority of the requests that name one (header
`x-gateway-inference-objective`, or llm-d's `x-llm-d-inference-objective`), for admission and flow
control.

The resource, as GIE defines it (kubernetes-sigs/gateway-api-inference-extension,
apix/v1alpha2/inferenceobjective_types.go) and llm-d serves it (llm-d/llm-d-router,
config/crd/bases/llm-d.ai_inferenceobjectives.yaml):

    apiVersion: inference.networking.x-k8s.io/v1alpha2   # or llm-d.ai/v1alpha2
    kind: InferenceObjective
    metadata: {name: interactive}
    spec:
      poolRef: {name: my-pool}
      priority: 10          # optional; unset is 0; higher is served first; < 0 is sheddable

A request naming no objective, or one the pool does not have, has priority 0 (upstream's default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from epick.datalayer.resources import pool_resource

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha2", "llm-d.ai/v1alpha2")
KIND = "InferenceObjective"
PLURAL = "inferenceobjectives"


class ObjectiveError(ValueError):
    """A resource that cannot be used; the message names the resource and the field."""


@dataclass(frozen=True, slots=True)
class Objective:
    name: str
    pool: str
    created: str
    priority: int


def parse_objective(obj: Mapping[str, Any], where: str = "") -> Objective:
    """One resource, validated as the CRD validates it; `where` prefixes error messages."""
    r = pool_resource(obj, KIND, API_VERSIONS, where, ObjectiveError)
    priority = r.spec.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ObjectiveError(f"{r.at}spec.priority must be an integer, got {priority!r}")
    return Objective(r.name, r.pool, r.created, priority)


def priorities(objectives: Iterable[Objective]) -> dict[str, int]:
    """Objective name -> priority (a name in two API groups: the older resource wins)."""
    out: dict[str, int] = {}
    for o in sorted(objectives, key=lambda o: (o.created, o.name)):
        out.setdefault(o.name, o.priority)
    return out
