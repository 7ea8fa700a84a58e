"""What the pods are and which of them serve: an InferencePool's selector and target ports (v1 or
v1alpha2 shape, or a label selector given directly), and a Ready pod's endpoints (one per target port:
`<pod>`, or `<pod>-rank-<i>` when there are several, as the Go EPP names them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epick.datalayer.datastore import EndpointSpec
from epick.datalayer.discovery.kubernetes.api import Json, _metadata
from epick.datalayer.discovery.static import DiscoveryError
from epick.framework.labels import SelectorError, from_structured

POOL_PLURAL = "inferencepools"
POOL_API_VERSIONS = (("inference.networking.k8s.io", "v1"), ("inference.networking.x-k8s.io", "v1alpha2"))
DEFAULT_TARGET_PORTS = (8000,)


@dataclass(frozen=True, slots=True)
class _Target:
    """What the pods are chosen by: a label selector (API syntax) and the ports to serve on."""

    selector: str
    ports: tuple[int, ...]
    # The pool's spec.appProtocol ("http", "kubernetes.io/h2c"; "" when it sets none): checked
    # against the config's parsers, as upstream's readiness does.
    app_protocol: str = ""


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


def _parse_pool(pool: Json, where: str) -> _Target:
    """The selector and ports of an InferencePool, v1 or v1alpha2 shape."""
    spec = pool.get("spec")
    if not isinstance(spec, dict):
        raise DiscoveryError(f"{where}: the InferencePool has no spec")
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        raise DiscoveryError(f"{where}: spec.selector is missing")
    try:
        if isinstance(selector.get("matchLabels"), dict) or "matchExpressions" in selector:  # v1
            expressions = selector.get("matchExpressions") or []
            parsed = from_structured(selector.get("matchLabels") or {}, expressions)
        else:  # v1alpha2: a flat map
            parsed = from_structured(selector)
    except SelectorError as e:
        raise DiscoveryError(f"{where}: spec.selector: {e}") from None
    text = parsed.render()
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
    protocol = spec.get("appProtocol")
    return _Target(text, checked, protocol if isinstance(protocol, str) else "")


def _describe_target(target: _Target) -> str:
    return f"selector {target.selector}, target ports {list(target.ports)}"


def _where(specs: Sequence[EndpointSpec]) -> str:
    return ", ".join(f"{s.name}={s.host_port}" for s in specs)
