"""`topology-stamp-handler` (llm-d, alpha): put the topology of a profile's chosen endpoint on the
response, for a coordinator to carry from the prefill response to the decode request.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/responsereceived/
topologystamp/stamp.go, its newest stored version (the one with `ValidateHeaderName`), and README.md
at b8bbcc8c; the wire format of pkg/epp/framework/plugins/scheduling/util/topology/header.go at
c9505aab): when the response's headers arrive it reads the `Topology` attribute that
`topology-extractor` wrote on the first target of profile `profileName` (the primary profile when
empty) and sets response header `headerName` to its encoding. It sets nothing when that profile did
not run or chose no endpoint (a decode-only request that skipped prefill), when the endpoint has no
`Topology` attribute, or when the encoding is empty.

Parameters (all optional): `headerName` (default `x-peer-topology`; any other name, compared without
regard to case, is refused: the coordinator knows that one name only; written in lower case),
`profileName` (default "": the primary profile), `topologyProducerName` (default "": the
`topology-extractor` instance of that name, "Topology/<name>", default `topology-extractor`).

The encoding (`encode_topology`): `key=value` pairs joined by ",", in the order host, rack, zone,
region; an empty value, or one holding "," or "=", is left out. `decode_topology` reads it back: each
","-separated pair is cut at its first "=", a pair without "=" is skipped, an unknown key ignored.

How it finds the profile's endpoint in epick: a `ResponseReceived` hook is given the endpoint that
answered, not the scheduling result, so for a named profile the plugin also implements `PreRequest`
and notes, per request, that profile's first target (or that it is the primary profile, or that it
did not run); the note is taken when the response arrives, and notes left by requests that never got
one are dropped after `--plugin-state-staleness-threshold`. The header goes out through
`Response.add_headers` (the proxy and ext_proc both send it to the client).

Deliberate deviation: for the primary profile (`profileName` empty, or naming the primary profile)
epick stamps the endpoint that answered; upstream stamps the profile's first target. They differ only
when epick retried the request on another endpoint, and then the endpoint that answered is the true
peer.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    Response,
    SchedulingResult,
)
from epick.plugins.datalayer.topology import TYPE as EXTRACTOR_TYPE
from epick.plugins.datalayer.topology import Topology, topology_key
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "topology-stamp-handler"
PEER_TOPOLOGY_HEADER = "x-peer-topology"

# The wire keys, in the order they are written, and the Topology field each one carries.
_FIELDS = (("host", "hostname"), ("rack", "rack"), ("zone", "zone"), ("region", "region"))
_FIELD_OF = dict(_FIELDS)


def encode_topology(topology: Topology | None) -> str:
    """`topology` as the peer-topology header carries it ("" for None or an empty one)."""
    if topology is None:
        return ""
    pairs = []
    for key, attr in _FIELDS:
        value: str = getattr(topology, attr)
        if value and "," not in value and "=" not in value:
            pairs.append(f"{key}={value}")
    return ",".join(pairs)


def decode_topology(header: str) -> Topology:
    """The Topology a peer-topology header value carries (every field empty for "" or junk)."""
    found: dict[str, str] = {}
    for pair in header.split(","):
        key, eq, value = pair.partition("=")
        if not eq:
            continue
        attr = _FIELD_OF.get(key)
        if attr is not None:
            found[attr] = value
    return Topology(**found)


class TopologyStampParameters(Parameters):
    header_name: str = ""
    profile_name: str = ""
    topology_producer_name: str = ""


@dataclass(frozen=True, slots=True)
class _Note:
    """What PreRequest saw of the named profile: the primary one, or its first target (None: it did
    not run or chose nothing)."""

    at: float
    primary: bool
    target: Endpoint | None


class TopologyStampHandler(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING  # acts on the response only; never changes a decision

    def __init__(
        self,
        name: str | None = None,
        *,
        header_name: str = PEER_TOPOLOGY_HEADER,
        profile_name: str = "",
        producer_name: str = "",
        clock: Callable[[], float] = time.monotonic,
        stale_after: float = 300.0,
    ) -> None:
        super().__init__(name)
        self.header_name = header_name.lower()
        self.profile_name = profile_name
        self.key = topology_key(producer_name or EXTRACTOR_TYPE)
        self._clock = clock
        self.stale_after = stale_after
        self._notes: OrderedDict[int, _Note] = OrderedDict()  # by request key, oldest first

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        if not self.profile_name:
            return  # the primary profile: the endpoint that answers is the one to stamp
        now = self._clock()
        self._sweep(now)
        primary = self.profile_name == result.primary_profile
        target = None
        if not primary:
            run = result.profile_results.get(self.profile_name)
            target = run.targets[0] if run is not None and run.targets else None
        self._notes.pop(request.key, None)  # decided again (a retry): the newest decision counts
        self._notes[request.key] = _Note(now, primary, target)

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        if self.profile_name:
            note = self._notes.pop(request.key, None)
            if note is None:
                return  # not decided by this config's scheduling path
            stamped = endpoint if note.primary else note.target
        else:
            stamped = endpoint
        if stamped is None:
            return
        topology = stamped.attribute(self.key)
        if not isinstance(topology, Topology):
            return
        encoded = encode_topology(topology)
        if encoded:
            response.add_headers[self.header_name] = encoded

    @property
    def pending(self) -> int:
        """Requests decided whose response has not arrived yet (named profile only)."""
        return len(self._notes)

    def _sweep(self, now: float) -> None:
        """Drop notes older than `stale_after`: a request whose response never came (every attempt
        failed, the client left) must not be remembered for ever."""
        cutoff = now - self.stale_after
        notes = self._notes
        while notes:
            key, note = next(iter(notes.items()))
            if note.at >= cutoff:
                return
            del notes[key]


def _factory(name: str, params: TopologyStampParameters, handle: Handle) -> TopologyStampHandler:
    header = params.header_name
    if header and header.lower() != PEER_TOPOLOGY_HEADER:
        raise ParameterError(
            "headerName",
            f'peer topology header name "{header}" is not supported; coordinator deployments '
            f'require "{PEER_TOPOLOGY_HEADER}"',
            f"leave headerName out, or set it to {PEER_TOPOLOGY_HEADER}",
        )
    return TopologyStampHandler(
        name,
        header_name=header or PEER_TOPOLOGY_HEADER,
        profile_name=params.profile_name,
        producer_name=params.topology_producer_name,
        clock=handle.clock,
        stale_after=handle.plugin_state_staleness,
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    TopologyStampParameters,
    "set response header x-peer-topology to the topology of a profile's chosen endpoint",
    worker_state="",
)
