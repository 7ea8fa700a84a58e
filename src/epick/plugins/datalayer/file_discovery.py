"""`file-discovery`: the pool's endpoints from a YAML or JSON file, configured at
`dataLayer.discovery.pluginRef`.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/discovery/file, docs/discovery.md):
parameters `path` (required) and `watchFile` (default false: read once). The file is at most 1 MiB:

    endpoints:
    - name: vllm-0          # required, unique (a later entry of the same name wins, as upstream)
      namespace: ns1        # optional, default "default"
      address: 10.0.0.1     # an IPv4 address
      port: "8000"          # 1..65535 (upstream wants a string; epick takes a number too)
      labels: {llm-d.ai/role: decode}

A bad entry is skipped and reported; on the first load any bad entry fails startup, on a reload it is
logged and the rest applies (upstream's rules). The service's data layer reads and watches the file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from epick.framework import NamedPlugin, Reads
from epick.plugins.debug_state import MAX_LISTED, capped
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "file-discovery"
MAX_FILE_BYTES = 1 << 20


class FileDiscoveryParameters(Parameters):
    path: str = ""
    watch_file: bool = False


@dataclass(frozen=True, slots=True)
class FileEndpoint:
    name: str
    address: str
    port: int
    namespace: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)


class EndpointsFileError(ValueError):
    """The file cannot be read as an endpoints list at all."""


def parse_endpoints_file(data: bytes, *, hostnames: bool = False) -> tuple[list[FileEndpoint], list[str]]:
    """(the valid endpoints, one error per bad entry naming it). Raises `EndpointsFileError` when
    the document itself is wrong. `hostnames`: an address may be an IPv6 address or a DNS name too
    (`multicluster-file-discovery`'s rule), not only an IPv4 address."""
    if len(data) > MAX_FILE_BYTES:
        raise EndpointsFileError(f"endpoints file exceeds 1 MiB ({len(data)} bytes)")
    try:
        doc = yaml.safe_load(data) if data.strip() else {}
    except yaml.YAMLError as e:
        raise EndpointsFileError(f"not YAML or JSON: {e}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise EndpointsFileError("the file must be an object with an 'endpoints' list")
    unknown = sorted(map(str, set(doc) - {"endpoints"}))
    if unknown:
        raise EndpointsFileError(f"unknown field(s) {', '.join(map(repr, unknown))} (only 'endpoints')")
    entries = doc.get("endpoints") or []
    if not isinstance(entries, list):
        raise EndpointsFileError("'endpoints' must be a list")
    found: dict[str, FileEndpoint] = {}
    errors: list[str] = []
    for i, entry in enumerate(entries):
        try:
            ep = _entry(entry, hostnames)
        except ValueError as e:
            errors.append(f"endpoints[{i}]: {e}")
            continue
        found[ep.name] = ep
    return list(found.values()), errors


def is_host(address: str) -> bool:
    """An IP address (v4 or v6) or a DNS-1123 subdomain: lower-case labels of letters, digits and
    inner hyphens, dot-separated, 253 characters at most (Kubernetes' rule, as upstream checks)."""
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return len(address) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in address.split("."))


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _entry(entry: object, hostnames: bool = False) -> FileEndpoint:
    if not isinstance(entry, dict):
        raise ValueError("an entry is an object with name, address and port")
    unknown = sorted(map(str, set(entry) - {"name", "namespace", "address", "port", "labels"}))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(map(repr, unknown))}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("'name' must be a non-empty string")
    namespace = entry.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise ValueError(f"{name}: 'namespace' must be a string")
    address = entry.get("address")
    if hostnames:
        if not isinstance(address, str) or not is_host(address):
            raise ValueError(f"{name}: invalid host {address!r} (an IP address or a DNS name)")
    else:
        try:
            ipaddress.IPv4Address(address if isinstance(address, str) else "")
        except ValueError:
            raise ValueError(f"{name}: invalid IPv4 address {address!r}") from None
    port = entry.get("port")
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"{name}: invalid port {entry.get('port')!r} (1..65535)")
    labels = entry.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ValueError(f"{name}: 'labels' must map strings to strings")
    assert isinstance(address, str)
    return FileEndpoint(name, address, port, namespace, dict(labels))


class FileDiscovery(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING
    hostnames = False  # whether an address may be a DNS name or an IPv6 address
    _loaded: list[str]  # the endpoints of the last file read

    def parse(self, data: bytes) -> tuple[list[FileEndpoint], list[str]]:
        found, errors = parse_endpoints_file(data, hostnames=self.hostnames)
        self._loaded = [f"{ep.namespace}/{ep.name}" for ep in found]
        return found, errors

    def __init__(self, name: str | None, path: str, watch_file: bool = False) -> None:
        super().__init__(name)
        self.path = path
        self.watch_file = watch_file
        self._loaded = []

    def dump_state(self) -> object:
        """The endpoints the file gave at its last read (`/debug/plugins/state`), as upstream's."""
        return {
            "endpoints": capped(self._loaded),
            "totalEndpoints": len(self._loaded),
            "maxEndpoints": MAX_LISTED,
        }


def _factory(name: str, params: FileDiscoveryParameters, handle: Handle) -> FileDiscovery:
    if not params.path:
        raise ParameterError("path", "'path' parameter is required", "set it to the endpoints file")
    return FileDiscovery(name, params.path, params.watch_file)


SPEC = PluginSpec(TYPE, _factory, FileDiscoveryParameters, "the pool's endpoints from a YAML/JSON file")
