"""`session-id-producer`: the request's session id, read from a header or a cookie, for other plugins.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/sessionid/
producer.go; the key is pkg/epp/framework/plugins/datalayer/attribute/session/data_types.go). Exactly
one of `headerName` (trimmed and lower-cased: request header names are lower case) or `cookieName`
(trimmed, case kept) must be set. Before scheduling it reads the id: the header's value, or the value
of the first pair of the `cookie` header (split on `;`, each pair trimmed and split at its first `=`)
whose name equals `cookieName`, case-sensitively; the id is trimmed, and an empty one writes nothing.
It publishes the id (a `str`) as "SessionIDDataKey/<its name>", which a session-affinity plugin reads
with an attribute source `{attribute: SessionIDDataKey, producer: <its name>}`.

Where the id lives: upstream puts it in the request's attribute store; epick's requests are immutable,
so it goes to the scheduling call's cycle state under the same key, which the filters, scorers and
PreRequest hooks of that request see. Upstream registers this type as the default producer of its key,
but its factory refuses to be built without parameters, so nothing can auto-create it; epick does not
try either.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "session-id-producer"
SESSION_ID_DATA_TYPE = "SessionIDDataKey"
COOKIE_HEADER = "cookie"


def session_id_key(producer_name: str = TYPE) -> str:
    """The cycle-state key a session-id producer named `producer_name` writes."""
    return data_key(SESSION_ID_DATA_TYPE, producer_name)


def read_session_id(cycle_state: CycleState, producer_name: str = TYPE) -> str | None:
    """The session id the producer `producer_name` published for this request, if any (upstream's
    `ReadSessionID`, which always reads the default producer's key)."""
    return cycle_state.read(session_id_key(producer_name), str)


def cookie_value(header: str, name: str) -> str:
    """The value of cookie `name` in a `cookie` header ("" when absent): the first `;`-separated pair,
    trimmed, whose part before its first `=` is exactly `name`. Pairs without `=` are skipped."""
    if not header or not name:
        return ""
    for pair in header.split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            return value
    return ""


class SessionIdParameters(Parameters):
    header_name: str = ""
    cookie_name: str = ""


class SessionIdProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS

    def __init__(self, name: str | None = None, params: SessionIdParameters | None = None) -> None:
        super().__init__(name)
        params = params or SessionIdParameters()
        self.header_name = params.header_name.strip().lower()
        self.cookie_name = params.cookie_name.strip()
        if not self.header_name and not self.cookie_name:
            raise ParameterError(
                "headerName",
                f"'{TYPE}' requires exactly one of headerName or cookieName to be set",
                "set headerName (a request header) or cookieName (a cookie of the cookie header)",
            )
        if self.header_name and self.cookie_name:
            raise ParameterError(
                "headerName",
                f"'{TYPE}' requires exactly one of headerName or cookieName to be set, not both",
                "remove headerName or cookieName",
            )
        self.key = session_id_key(self.name)

    def session_id(self, request: InferenceRequest) -> str:
        """The request's session id, "" when it carries none."""
        if self.header_name:
            return request.headers.get(self.header_name, "").strip()
        return cookie_value(request.headers.get(COOKIE_HEADER, ""), self.cookie_name).strip()

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        session = self.session_id(request)
        if session:
            cycle_state.write(self.key, session)


def _factory(name: str, params: SessionIdParameters, handle: Handle) -> SessionIdProducer:
    return SessionIdProducer(name, params)


SPEC = PluginSpec(TYPE, _factory, SessionIdParameters, "the request's session id, from a header or a cookie")
