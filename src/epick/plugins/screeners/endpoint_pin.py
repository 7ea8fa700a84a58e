"""`endpoint-pin-screener` (llm-d, alpha): keep only the endpoint a request's `x-llm-d-pin-host-port`
header names.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/screener/endpointpin/
screener.go and README.md, read at 21e59c40 / 7a8bf457 and 7435f357): a screener, so it runs once per
request after admission and before the data producers and every profile; it is discovered from
`plugins:` and never named in a profile. It takes no parameters.

- A request without the header, or with an empty one, keeps every candidate.
- Otherwise the value is read as `<ip>:<port>` the way Go's `netip.ParseAddrPort` reads it: an IPv4
  address in dotted-quad form, or an IPv6 address in square brackets (an optional `%zone` inside
  them), then a decimal port of at most 65535. A value that is not such an address keeps no
  candidate.
- The address is put in canonical form (lower case, zeros compressed, an IPv4-mapped IPv6 address as
  `::ffff:a.b.c.d`), so every spelling of it matches, and the request keeps only the first candidate
  with that address and port.
- No candidate matching keeps none: the request gets 503. There is no fallback to another pod, since
  the pinned request's peer (in SGLang disaggregation, the decode request naming its prefill pod in
  `bootstrap_host`) relies on that pod.

EPP does not forward the header to the model server (upstream strips it; in epick it is one of the
director's control headers).

Deliberate deviation: upstream compares the canonical address with the address the endpoint stores,
as stored; epick also puts the endpoint's address in canonical form when it is an IP address, so an
endpoint listed with another spelling (an upper-case IPv6 address in a file) matches too.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "endpoint-pin-screener"
PIN_HEADER = "x-llm-d-pin-host-port"

_PORT = re.compile(r"[0-9]+")
_MAX_PORT = 65535


def canonical_address(text: str) -> str | None:
    """`text` as Go's `netip.Addr.String` writes it, or None when it is not an IP address."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        zone = f"%{ip.scope_id}" if ip.scope_id else ""
        return f"::ffff:{ip.ipv4_mapped}{zone}"
    return str(ip)


def parse_pin(value: str) -> tuple[str, int] | None:
    """(canonical address, port) of an `<ip>:<port>` value, read as Go's `netip.ParseAddrPort` reads
    it (IPv6 in brackets, IPv4 without); None when it is not one."""
    host, colon, port = value.rpartition(":")
    if not colon or not host or not _PORT.fullmatch(port):
        return None
    number = int(port)
    if number > _MAX_PORT:
        return None
    bracketed = host.startswith("[")
    if bracketed:
        if len(host) < 2 or not host.endswith("]"):
            return None
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if bracketed != (ip.version == 6):
        return None  # brackets for IPv6 only, and IPv6 only in brackets
    address = canonical_address(host)
    return None if address is None else (address, number)


class EndpointPinScreener(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS

    def screen(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        pin = request.headers.get(PIN_HEADER, "")
        if not pin:
            return endpoints
        parsed = parse_pin(pin)
        if parsed is None:
            return []
        address, port = parsed
        for ep in endpoints:
            if ep.port != port:
                continue
            if ep.address == address or canonical_address(ep.address) == address:
                return [ep]
        return []


def _factory(name: str, params: NoParameters, handle: Handle) -> EndpointPinScreener:
    return EndpointPinScreener(name)


SPEC = PluginSpec(
    TYPE,
    _factory,
    NoParameters,
    "keep only the endpoint the x-llm-d-pin-host-port header names (<ip>:<port>); none there: 503",
    worker_state="",
)
