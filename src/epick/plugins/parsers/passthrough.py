"""`passthrough-parser`: claims no path, so it takes every path no other parser claims (list it last);
the body is forwarded unread and unchanged, no model is required or rewritten, and scheduling has no
prompt to go by (prefix scorers see an empty prompt). Responses are not read."""

from __future__ import annotations

from collections.abc import Mapping

from epick.framework import NamedPlugin, Reads, RequestBody, Usage
from epick.framework.parsing import ParsedRequest
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "passthrough-parser"


class PassthroughParser(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING  # parsers read requests before scheduling; no scheduling result depends on them

    @property
    def paths(self) -> tuple[str, ...]:
        return ()

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        return ParsedRequest(RequestBody(kind="raw", source=""), "", None)

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        return None


def _factory(name: str, params: NoParameters, handle: Handle) -> PassthroughParser:
    return PassthroughParser(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "any path: the body forwarded unread (the fallback)")
