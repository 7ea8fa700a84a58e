"""`header-based-testing-filter`: keep the endpoints the request's `test-epp-endpoint-selection` header
names, as GIE's conformance tests ask (gateway-api-inference-extension,
`pkg/epp/framework/plugins/scheduling/test/filter/request_header_based_filter.go`).

The header is a comma-separated list of `IP` or `IP:port` (an IPv6 address bracketed when a port
follows). An `IP:port` entry keeps the endpoint at that address and port, a bare `IP` an endpoint at
that address; in the header's order, at most one endpoint per IP. No header, or a blank one, keeps
none. As upstream's, a bare IP keeps the last endpoint listed at that address.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "header-based-testing-filter"
HEADER = "test-epp-endpoint-selection"


def _split(entry: str) -> tuple[str, str | None]:
    """(IP, port or None) of one entry."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, None  # a bare IPv4, or a bare IPv6 address


class HeaderBasedTestingFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        wanted = request.headers.get(HEADER, "").strip()
        if not wanted:
            return []
        by_address = {(ep.address, str(ep.port)): ep for ep in endpoints}
        by_ip = {ep.address: ep for ep in endpoints}  # the last one at each address
        kept: list[Endpoint] = []
        seen: set[str] = set()
        for entry in (e.strip() for e in wanted.split(",")):
            if not entry:
                continue
            ip, port = _split(entry)
            found = by_address.get((ip, port)) if port is not None else by_ip.get(ip)
            if found is not None and found.address not in seen:
                seen.add(found.address)
                kept.append(found)
        return kept


def _factory(name: str, params: NoParameters, handle: Handle) -> HeaderBasedTestingFilter:
    return HeaderBasedTestingFilter(name)


SPEC = PluginSpec(
    TYPE, _factory, NoParameters, "keep the endpoints the test-epp-endpoint-selection header names"
)
