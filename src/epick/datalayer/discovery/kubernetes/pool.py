"""What the pods are and which of them serve: an InferencePool's selector and target ports (v1 or
v1alpha2 shape, or a label selector given directly), and a Ready pod's endpoints (one per target port:
`<pod>`, or `<pod>-rank-<i>` when there are several, as the Go EPP names them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epick.datalayer.datastore import EndpointSpec
from epick.datalayer.discovery.kubernetes.api import Json, _metadata
from epick.datalayer.discovery.static import DiscoveryError

POOL_PLURAL = "inferencepools"
POOL_API_VERSIONS = (("inference.networking.k8s.io", "v1"), ("inference.networking.x-k8s.io", "v1alpha2"))
DEFAULT_TARGET_PORTS = (8000,)


@dataclass(frozen=True, slots=True)
class _Target:
    """What the pods are chosen by: a label selector (API syntax) and the ports to serve on."""

    selector: str
    ports: tuple[int, ...]


def endpoints_of(pod: Json, target: _Target | None) -> tuple[str, tuple[EndpointSpec, ...], str]:
    """(pod name, its endpoints, why it has none)."""
    meta = _metadata(pod)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return "", (), "no name"
    status = pod.get("status")
    status = status if isinstance(status, dict) else {}
    if meta.get("deletionTimestamp"):
        return name, (), "being deleted"
    ip = status.get("podIP")
    if not isinstance(ip, str) or not ip:
        return name, (), "no pod IP"
    if not _is_ready(status):
        return name, (), "not Ready"
    if target is None:
        return name, (), "no pool"
    raw_labels = meta.get("labels")
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, dict) else {}
    ports = target.ports
    host_ip = status.get("hostIP")
    node = host_ip if isinstance(host_ip, str) else ""
    if len(ports) == 1:
        return name, (EndpointSpec(name, ip, ports[0], labels, name, node),), ""
    return (
        name,
        tuple(EndpointSpec(f"{name}-rank-{i}", ip, p, labels, name, node) for i, p in enumerate(ports)),
        "",
    )


def _is_ready(status: Json) -> bool:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return False
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def _check_ports(ports: Sequence[Any], where: str) -> tuple[int, ...]:
    if not ports:
        raise DiscoveryError(f"{where}: give at least one port")
    for p in ports:
        if not isinstance(p, int) or isinstance(p, bool) or not 0 < p < 65536:
            raise DiscoveryError(f"{where}: {p!r} is not a port in 1..65535")
    if len(set(ports)) != len(ports):
        raise DiscoveryError(f"{where}: {list(ports)} repeats a port")
    return tuple(ports)


def _selector_string(match_labels: Mapping[Any, Any], where: str) -> str:
    for k, v in match_labels.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise DiscoveryError(f"{where}: matchLabels must map label names to strings, got {k!r}: {v!r}")
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def _expression(expr: Any, where: str) -> str:
    if not isinstance(expr, dict) or not isinstance(expr.get("key"), str):
        raise DiscoveryError(f"{where}: a matchExpressions entry needs a key")
    key: str = expr["key"]
    op, values = expr.get("operator"), expr.get("values") or []
    if op in ("In", "NotIn"):
        if not values or not all(isinstance(v, str) for v in values):
            raise DiscoveryError(f"{where}: matchExpressions {key!r} {op} needs values")
        return f"{key} {op.lower()} ({','.join(values)})"
    if op == "Exists":
        return key
    if op == "DoesNotExist":
        return f"!{key}"
    raise DiscoveryError(f"{where}: matchExpressions {key!r} has an unknown operator {op!r}")


def _parse_pool(pool: Json, where: str) -> _Target:
    """The selector and ports of an InferencePool, v1 or v1alpha2 shape."""
    spec = pool.get("spec")
    if not isinstance(spec, dict):
        raise DiscoveryError(f"{where}: the InferencePool has no spec")
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        raise DiscoveryError(f"{where}: spec.selector is missing")
    if isinstance(selector.get("matchLabels"), dict) or "matchExpressions" in selector:  # v1
        parts = [_selector_string(selector.get("matchLabels") or {}, f"{where}: spec.selector")]
        parts += [_expression(e, f"{where}: spec.selector") for e in selector.get("matchExpressions") or []]
        text = ",".join(p for p in parts if p)
    else:  # v1alpha2: a flat map
        text = _selector_string(selector, f"{where}: spec.selector")
    if not text:
        raise DiscoveryError(f"{where}: spec.selector is empty (it would select every pod in the namespace)")
    if "targetPorts" in spec:
        raw = spec.get("targetPorts")
        entries = raw if isinstance(raw, list) else [raw]
        ports = [e.get("number") if isinstance(e, dict) else e for e in entries]
        checked = _check_ports(ports, f"{where}: spec.targetPorts")
    elif "targetPortNumber" in spec:
        checked = _check_ports([spec.get("targetPortNumber")], f"{where}: spec.targetPortNumber")
    else:
        raise DiscoveryError(f"{where}: no spec.targetPorts (v1) or spec.targetPortNumber (v1alpha2)")
    return _Target(text, checked)


def _describe_target(target: _Target) -> str:
    return f"selector {target.selector}, target ports {list(target.ports)}"


def _where(specs: Sequence[EndpointSpec]) -> str:
    return ", ".join(f"{s.name}={s.host_port}" for s in specs)
