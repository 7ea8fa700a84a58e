"""What InferenceModelRewrite and InferenceObjective resources share: a kind, an API version of the
groups that serve them, a name, and a `spec.poolRef.name` naming the pool they belong to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PoolResource:
    name: str
    pool: str
    created: str  # RFC 3339 creation timestamp ("" when unknown)
    spec: Mapping[str, Any]
    at: str  # the prefix of error messages about this resource: "<where>: <Kind> '<name>': "


def pool_resource(
    obj: Any, kind: str, api_versions: tuple[str, ...], where: str, error: type[ValueError]
) -> PoolResource:
    """Check the parts every pool resource has, as its CRD does; raises `error` naming the field."""
    at = f"{where}: " if where else ""
    if not isinstance(obj, Mapping):
        raise error(f"{at}an {kind} must be a mapping")
    if obj.get("kind") != kind:
        raise error(f"{at}kind must be {kind}, got {obj.get('kind')!r}")
    if obj.get("apiVersion") not in api_versions:
        raise error(f"{at}apiVersion must be one of {', '.join(api_versions)}, got {obj.get('apiVersion')!r}")
    meta = obj.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise error(f"{at}metadata.name is required")
    at = f"{at}{kind} {name!r}: "
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise error(f"{at}spec is required")
    pool_ref = spec.get("poolRef")
    pool = pool_ref.get("name") if isinstance(pool_ref, Mapping) else None
    if not isinstance(pool, str) or not pool:
        raise error(f"{at}spec.poolRef.name is required")
    return PoolResource(name, pool, str(meta.get("creationTimestamp") or ""), spec, at)
