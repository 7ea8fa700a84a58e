"""What request-control hooks learn about a model server's response."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class Response:
    """A response as it arrives: headers first, then (streaming) chunks, then completion.

    The front end fills it in as it goes; hooks read it. `chunk` is the latest body chunk.
    """

    request_id: str
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    streaming: bool = False
    chunk: bytes = b""
    end_of_stream: bool = False
    usage: Usage | None = None
    error: str | None = None  # set when the response failed (connection lost, 5xx)
    # Headers hooks want added to the client's response (e.g. a session token).
    add_headers: dict[str, str] = field(default_factory=dict)
    # What hooks report to the gateway once the response is complete, by namespace then key (e.g.
    # {"envoy.lb": {"x-gateway-inference-request-cost": 42.0}}): ext_proc sends it as dynamic metadata
    # with the last response-body answer; the proxy as headers when it has not sent them yet.
    dynamic_metadata: dict[str, dict[str, float | str | bool]] = field(default_factory=dict)
    # What the gateway sent with the response headers as metadata, by namespace then key (ext_proc's
    # metadata_context: e.g. {"envoy.lb": {"x-gateway-destination-endpoint-served": "10.0.0.1:8000"}}).
    metadata: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
