"""`envoy.service.ext_proc.v3.ExternalProcessor` on grpc.aio: the gateway's side of the EPP protocol.

Per request stream (Envoy's processing mode: request headers SEND, request body BUFFERED, response
headers SEND, response body STREAMED):
- request headers: remembered; answered with an empty headers response;
- request body (complete): the director decides. The answer sets header
  `x-gateway-destination-endpoint` to the primary `ip:port` (what an original-destination cluster
  routes on), `x-prefiller-host-port` for P/D, removes the control headers and any client-supplied
  destination, rewrites the body if the model was rewritten, sets dynamic metadata
  `envoy.lb/x-gateway-destination-endpoint` = primary then fallbacks, comma-separated, and clears the
  route cache. An error is an `ImmediateResponse` with its status and a JSON body;
- response headers, body chunks and end of stream: the director's response hooks.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epick.framework import Endpoint, Response
from epick.framework.request import RequestKind
from epick.requestcontrol.director import (
    CONTROL_HEADERS,
    DESTINATION_HEADER,
    PREFILL_HEADER,
    Decision,
    Director,
)
from epick.requestcontrol.errors import RequestError

log = logging.getLogger(__name__)
LB_NAMESPACE = "envoy.lb"
SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


@dataclass(slots=True)
class _Stream:
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    decision: Decision | None = None
    endpoint: Endpoint | None = None
    response: Response | None = None
    completed: bool = False


def _kind(path: str) -> RequestKind | None:
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completion"
    return None


def _set(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _headers(message: pb.HttpHeaders) -> dict[str, str]:
    return {
        h.key.lower(): (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
        for h in message.headers.headers
    }


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, director: Director) -> None:
        self.director = director

    async def Process(  # noqa: N802 (the gRPC method name)
        self, requests: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = _Stream()
        try:
            async for message in requests:
                kind = message.WhichOneof("request")
                if kind == "request_headers":
                    stream.headers = _headers(message.request_headers)
                    if message.request_headers.end_of_stream:
                        yield self._decide(stream)
                    else:
                        yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
                elif kind == "request_body":
                    stream.body += message.request_body.body
                    if message.request_body.end_of_stream:
                        yield self._decide(stream)
                elif kind == "request_trailers":
                    yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
                elif kind == "response_headers":
                    yield self._response_headers(stream, message.response_headers)
                elif kind == "response_body":
                    yield self._response_body(stream, message.response_body)
                elif kind == "response_trailers":
                    self._complete(stream, None)
                    yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
        finally:
            self._complete(stream, "stream ended before the response did")

    def _decide(self, stream: _Stream) -> pb.ProcessingResponse:
        try:
            decision = self.director.decide(
                bytes(stream.body), stream.headers, _kind(stream.headers.get(":path", ""))
            )
        except RequestError as e:
            return pb.ProcessingResponse(
                immediate_response=pb.ImmediateResponse(
                    status=http_status_pb2.HttpStatus(code=e.status),
                    headers=pb.HeaderMutation(set_headers=[_set("content-type", "application/json")]),
                    body=e.body(),
                    details=e.code,
                )
            )
        stream.decision = decision
        stream.endpoint = decision.targets[0]
        mutation = pb.HeaderMutation(
            set_headers=[_set(DESTINATION_HEADER, decision.targets[0].host_port)],
            remove_headers=sorted(CONTROL_HEADERS - {DESTINATION_HEADER} | {PREFILL_HEADER}),
        )
        prefill = decision.prefill
        if prefill is not None:
            mutation.set_headers.append(_set(PREFILL_HEADER, prefill.host_port))
            mutation.remove_headers.remove(PREFILL_HEADER)
        common = pb.CommonResponse(header_mutation=mutation, clear_route_cache=True)
        if decision.body != bytes(stream.body):
            common.body_mutation.body = decision.body
            mutation.set_headers.append(_set("content-length", str(len(decision.body))))
        metadata = struct_pb2.Struct()
        metadata.update(
            {LB_NAMESPACE: {DESTINATION_HEADER: ",".join(ep.host_port for ep in decision.targets)}}
        )
        return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata)

    def _response_headers(self, stream: _Stream, message: pb.HttpHeaders) -> pb.ProcessingResponse:
        answer = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
        d, endpoint = stream.decision, stream.endpoint
        if d is None or endpoint is None:
            return answer
        headers = _headers(message)
        status = int(headers.get(":status", "200") or 200)
        stream.response = Response(
            d.request.request_id, status=status, headers=headers, streaming=d.request.body.stream
        )
        self.director.response_received(d.request, stream.response, endpoint)
        if stream.response.add_headers:
            answer.response_headers.response.header_mutation.set_headers.extend(
                _set(k, v) for k, v in stream.response.add_headers.items()
            )
        if message.end_of_stream:
            self._complete(stream, None)
        return answer

    def _response_body(self, stream: _Stream, message: pb.HttpBody) -> pb.ProcessingResponse:
        d, endpoint, response = stream.decision, stream.endpoint, stream.response
        if d is not None and endpoint is not None and response is not None:
            response.chunk = message.body
            self.director.response_streaming(d.request, response, endpoint)
            if message.end_of_stream:
                self._complete(stream, None)
        return pb.ProcessingResponse(response_body=pb.BodyResponse())

    def _complete(self, stream: _Stream, error: str | None) -> None:
        d, endpoint = stream.decision, stream.endpoint
        if stream.completed or d is None or endpoint is None:
            return
        stream.completed = True
        response = stream.response or Response(d.request.request_id, status=0)
        response.end_of_stream = True
        response.chunk = b""
        if error is not None and response.status == 0:
            response.error = error
        self.director.response_complete(d.request, response, endpoint)


@dataclass(frozen=True, slots=True)
class ExtProcOptions:
    host: str = "0.0.0.0"
    port: int = 9002
    health_port: int = 9003
    secure: bool = True
    cert_path: str | None = None  # a directory with tls.crt and tls.key; self-signed when unset


class ExtProcServer:
    def __init__(self, director: Director, options: ExtProcOptions) -> None:
        self.director = director
        self.options = options
        self.port = options.port
        self.health_port = options.health_port
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()

    async def start(self) -> None:
        from epick.extproc.tls import load_pair, self_signed

        self._server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(self.director), self._server)
        address = f"{self.options.host}:{self.options.port}"
        if self.options.secure:
            key, cert = load_pair(self.options.cert_path) if self.options.cert_path else self_signed()
            self.port = self._server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
        else:
            self.port = self._server.add_insecure_port(address)
        await self._server.start()
        self._health_server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        self.health_port = self._health_server.add_insecure_port(
            f"{self.options.host}:{self.options.health_port}"
        )
        await self._health_server.start()
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self) -> None:
        for server in (self._server, self._health_server):
            if server is not None:
                await server.stop(grace=1.0)
