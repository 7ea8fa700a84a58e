"""A fixed list of endpoints: `--endpoints host:port,...` or `--endpoints-file FILE`.

The file is YAML or JSON: a list (or `{endpoints: [...]}`) of `{name, address, port, labels}`;
`name` defaults to `address:port`. Bad entries are errors naming the file, the entry and the field.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import yaml

from epick.datalayer.datastore import EndpointSpec


class DiscoveryError(ValueError):
    pass


def parse_endpoints_flag(value: str) -> list[EndpointSpec]:
    specs = []
    for i, item in enumerate(p.strip() for p in value.split(",")):
        if not item:
            continue
        address, port = _split_host_port(item, f"--endpoints item {i + 1} ({item!r})")
        specs.append(EndpointSpec(f"{address}:{port}", address, port, {}))
    if not specs:
        raise DiscoveryError("--endpoints: give at least one host:port")
    _check_unique(specs, "--endpoints")
    return specs


def load_endpoints_file(path: str | Path) -> list[EndpointSpec]:
    source = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise DiscoveryError(f"{source}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise DiscoveryError(f"{source}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise DiscoveryError(f"{source}: not valid YAML or JSON: {e}") from None
    if isinstance(raw, dict) and "endpoints" in raw:
        raw = raw["endpoints"]
    if not isinstance(raw, list) or not raw:
        raise DiscoveryError(f"{source}: expected a non-empty list of endpoints (or {{endpoints: [...]}})")
    specs = [_entry(source, i, item) for i, item in enumerate(raw)]
    _check_unique(specs, source)
    return specs


def _entry(source: str, i: int, item: Any) -> EndpointSpec:
    where = f"{source}: endpoints[{i}]"
    if isinstance(item, str):
        host, number = _split_host_port(item, where)
        return EndpointSpec(f"{host}:{number}", host, number, {})
    if not isinstance(item, dict):
        raise DiscoveryError(f"{where}: expected host:port or an object with address and port")
    unknown = set(item) - {"name", "address", "port", "labels"}
    if unknown:
        raise DiscoveryError(
            f"{where}: unknown fields {sorted(unknown)} (allowed: name, address, port, labels)"
        )
    address = item.get("address")
    port = item.get("port")
    if not isinstance(address, str) or not address:
        raise DiscoveryError(f"{where}.address: required, a host name or IP")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise DiscoveryError(f"{where}.port: required, an integer in 1..65535")
    labels = item.get("labels")
    if labels is None:
        labels = {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise DiscoveryError(f"{where}.labels: a mapping of strings to strings")
    name = item.get("name") or f"{address}:{port}"
    if not isinstance(name, str):
        raise DiscoveryError(f"{where}.name: a string")
    return EndpointSpec(name, address, port, labels)


def _split_host_port(item: str, where: str) -> tuple[str, int]:
    host, sep, port = item.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DiscoveryError(f"{where}: expected host:port with a port in 1..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise DiscoveryError(f"{where}: {host!r} in brackets is not an IPv6 address") from None
    return host, int(port)


def _check_unique(specs: list[EndpointSpec], source: str) -> None:
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise DiscoveryError(f"{source}: endpoint {s.name!r} is listed twice")
        seen.add(s.name)
