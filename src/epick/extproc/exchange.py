"""One ext_proc stream, as a state machine: Envoy's messages for a request and its response in, epick's
answers out, for every body mode a gateway can configure.

Envoy names its body modes in the first message (`protocol_config`); what each needs of epick:

- `BUFFERED` / `BUFFERED_PARTIAL`: the headers are answered at once and held by Envoy; the body comes in
  one message and its answer carries the routing (header mutation, cleared route cache).
- `STREAMED`: as buffered when the body comes in one message. A body in several messages cannot be
  routed: Envoy waits for each chunk's answer and then sends the headers upstream, before epick has the
  body. Such a request gets a 500 that names the setting (and epick logs it once); with
  `send_body_without_waiting_for_header_response` it works as full duplex below, where epick answers
  every chunk but the last with an emptied body and sends the whole body back in the last answer.
- `FULL_DUPLEX_STREAMED` (GIE's and llm-d's gateway settings), or any mode with
  `send_body_without_waiting_for_header_response`: Envoy sends the body without waiting. epick answers
  the headers only once the body is complete, with the routing, then sends the body back as streamed
  chunks; request trailers, when they come, end the body. Response chunks are echoed back as they come.
- `NONE` and `GRPC` request bodies cannot be routed (the model is in the body): every request gets a
  500 with a JSON body that names the setting, and epick logs it once per mode.

When Envoy sends no `protocol_config` (older versions), the request body is treated as `STREAMED`, which
also serves `BUFFERED`, and response chunks are acknowledged without being echoed.

epick asks for no more of a response than the service reads (`Director.response_needs`): with no
ResponseStreaming or ResponseComplete hook and no usage metrics, the answer to the request headers
carries a `mode_override` (honoured when the filter sets `allow_mode_override`, and neither body mode
is `FULL_DUPLEX_STREAMED` nor the body is sent early) that turns the response body off, and the
response headers too when nothing reads their status; the end of the stream then completes the
response. Where Envoy ignores overrides (a `FULL_DUPLEX_STREAMED` request body), a config that needs
nothing of the response ends the stream once the request is routed, unless the response body is
`FULL_DUPLEX_STREAMED` too: Envoy drains each response chunk it sends to the processor and drops
those it sent before it saw the stream end (it re-injects only `STREAMED`'s queued chunks), so epick
stays and echoes them. A gateway that ignores the override sends the response anyway, and it is
served as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epick.extproc import messages
from epick.framework import Endpoint, Response
from epick.requestcontrol import errors
from epick.requestcontrol.director import DEFAULT_PATH, Director, RequestCycle, ResponseNeeds
from epick.requestcontrol.errors import RequestError, too_large
from epick.wire.budget import BodyBudget
from epick.wire.http_messages import BodyDecodeError, BodyTooLargeError, decode_body

log = logging.getLogger(__name__)

_Mode = processing_mode_pb2.ProcessingMode
SEND, SKIP = _Mode.SEND, _Mode.SKIP
NONE = _Mode.NONE
STREAMED = _Mode.STREAMED
BUFFERED = _Mode.BUFFERED
BUFFERED_PARTIAL = _Mode.BUFFERED_PARTIAL
FULL_DUPLEX_STREAMED = _Mode.FULL_DUPLEX_STREAMED
GRPC = _Mode.GRPC
_UNROUTABLE = {NONE: "NONE", GRPC: "GRPC"}
_logged_unroutable: set[str] = set()


def _path(headers: Mapping[str, str]) -> str:
    """The request's path, as upstream finds it: the first of `:path`, `x-original-path` and
    `x-forwarded-path` that is given, without its query; the director's default when none is."""
    for name in (":path", "x-original-path", "x-forwarded-path"):
        value = headers.get(name, "")
        if value:
            return value.split("?", 1)[0]
    return DEFAULT_PATH


def _mode_error(setting: str) -> RequestError:
    return RequestError(
        500,
        f"epick cannot serve the gateway's ext_proc {setting}: it routes on the model and prompt in "
        "the request body and passes HTTP bodies; set request_body_mode and response_body_mode to "
        "FULL_DUPLEX_STREAMED (as GIE's gateways do), BUFFERED or STREAMED",
        "extproc_mode_unsupported",
    )


_STREAMED_IN_PIECES = RequestError(
    500,
    "epick cannot route a request body that comes in several messages under the gateway's ext_proc "
    "request_body_mode STREAMED: Envoy sends the headers upstream before the body is complete; set "
    "request_body_mode to FULL_DUPLEX_STREAMED (as GIE's gateways do) or BUFFERED, or set "
    "send_body_without_waiting_for_header_response",
    "extproc_mode_unsupported",
)


@dataclass(slots=True)
class Modes:
    request_body: int = STREAMED
    response_body: int = STREAMED
    early_body: bool = False  # send_body_without_waiting_for_header_response

    @classmethod
    def of(cls, config: pb.ProtocolConfiguration) -> Modes:
        return cls(
            config.request_body_mode,
            config.response_body_mode,
            config.send_body_without_waiting_for_header_response,
        )

    @property
    def takes_override(self) -> bool:
        """Whether Envoy honours a `mode_override` (given `allow_mode_override`): not when either body
        mode is full duplex, nor when the body is sent without waiting for the headers' answer."""
        return not self.early_body and FULL_DUPLEX_STREAMED not in (self.request_body, self.response_body)

    @property
    def headers_wait_for_body(self) -> bool:
        """Envoy sends the body before its headers are answered, so they are answered with the routing."""
        return self.request_body == FULL_DUPLEX_STREAMED or self.early_body


@dataclass(slots=True)
class Exchange:
    """The state of one stream. `handle` takes each message and returns what to send back, in order;
    after an immediate response `closed` is true and the stream should end."""

    director: Director
    modes: Modes = field(default_factory=Modes)
    headers: dict[str, str] = field(default_factory=dict)
    pieces: list[bytes] = field(default_factory=list)  # the request body as it came
    size: int = 0  # its length so far
    unanswered_chunks: int = 0  # body messages not yet answered (headers answered late)
    chunks: int = 0
    decision: RequestCycle | None = None
    response: Response | None = None
    completed: bool = False
    closed: bool = False
    # Set when routing waits in flow control: (phase, more); the server then awaits `admit`.
    pending: tuple[str, bool] | None = None
    # What the service reads of the response (set when the request headers are answered), and whether
    # the answer asked Envoy for less than the whole response (`mode_override`).
    needs: ResponseNeeds = ResponseNeeds.BODY
    overridden: bool = False
    # The gateway's endpoint subset hint (the addresses the request may go to), from the messages'
    # metadata; None: no hint.
    subset: frozenset[str] | None = None
    # The body came with a Content-Encoding and was decoded to be read: whatever is forwarded decoded
    # goes without that header.
    decoded: bool = False
    # When the request headers came, on the director's clock: the request's latencies count from it.
    arrived: float | None = None
    # The request-body bytes all streams hold at once (the server's), and what this one holds of them.
    budget: BodyBudget | None = None
    held: int = 0

    @property
    def body(self) -> bytes:
        """The request body received: its one message as it came (no copy), or the messages joined."""
        pieces = self.pieces
        if len(pieces) == 1:
            return pieces[0]
        joined = b"".join(pieces)
        self.pieces = [joined] if joined else []
        return joined

    def handle(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if message.HasField("protocol_config"):
            self.modes = Modes.of(message.protocol_config)
        if message.HasField("metadata_context") and self.director.subset_filter:
            hint = messages.subset_hint(message.metadata_context)
            if hint is not None:
                self.subset = hint
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._request_headers(message.request_headers)
        if kind == "request_body":
            return self._request_body(message.request_body)
        if kind == "request_trailers":
            return self._request_trailers()
        if kind == "response_headers":
            metadata = messages.metadata_of(message) if message.HasField("metadata_context") else {}
            return [self._response_headers(message.response_headers, metadata)]
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "response_trailers":
            answer = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
            if self._complete(None):
                self._attach_metadata(answer)
            return [answer]
        return []

    # The request.

    def _request_headers(self, message: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        if self.decision is not None or self.headers:
            # One stream is one request: a second set of request headers breaks the protocol.
            return self._fail(
                RequestError(400, "a second set of request headers on one ext_proc stream", "bad_stream")
            )
        self.headers = messages.headers_of(message)
        self.arrived = self.director.clock()
        self.needs = self.director.response_needs
        if message.end_of_stream:  # no body will follow
            return self._route(phase="headers", more=False)
        unroutable = _UNROUTABLE.get(self.modes.request_body)
        if unroutable is not None:
            setting = f"request_body_mode {unroutable}"
            return self._fail(_mode_error(setting), log_once=setting)
        if self.modes.response_body == GRPC:
            return self._fail(_mode_error("response_body_mode GRPC"), log_once="response_body_mode GRPC")
        if self.modes.headers_wait_for_body:
            return []
        return [self._override(pb.ProcessingResponse(request_headers=pb.HeadersResponse()))]

    def _request_body(self, message: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self.decision is not None:  # more body after routing: only a partial buffer does this
            return [pb.ProcessingResponse(request_body=pb.BodyResponse())]
        self.pieces.append(message.body)
        self.size += len(message.body)
        self.chunks += 1
        limit = self.director.max_body_bytes
        if self.size > limit:
            return self._fail(too_large(self.size, limit))
        if self.budget is not None:
            if not self.budget.take(len(message.body)):
                return self._fail(errors.bodies_held())
            self.held += len(message.body)
        whole = message.end_of_stream or self.modes.request_body in (BUFFERED, BUFFERED_PARTIAL)
        if whole:
            return self._route(phase="body", more=not message.end_of_stream)
        if self.modes.request_body == FULL_DUPLEX_STREAMED:
            return []
        if self.modes.headers_wait_for_body:
            self.unanswered_chunks += 1
            return []
        # STREAMED, headers answered: Envoy waits for this chunk's answer, and once it has one it sends
        # the headers upstream, before epick has the body to route on.
        return self._fail(_STREAMED_IN_PIECES, log_once="streamed-in-pieces")

    def _request_trailers(self) -> list[pb.ProcessingResponse]:
        trailers = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
        if self.decision is not None:
            self._end_early()
            return [trailers]
        if self.modes.request_body == FULL_DUPLEX_STREAMED or self.modes.headers_wait_for_body:
            answers = [*self._route(phase="body", more=True), trailers]
            if self.decision is not None:
                self._end_early()
            return answers
        # STREAMED, headers answered, and the body ended without end_of_stream: as a body in pieces.
        return self._fail(_STREAMED_IN_PIECES, log_once="streamed-in-pieces")

    def _route(self, *, phase: str, more: bool) -> list[pb.ProcessingResponse]:
        """Decide, and answer with the routing. `phase` is the message that completed the request
        (headers with no body, or the body); `more` is true when trailers follow the body."""
        if self.director.needs_async:
            self.pending = (phase, more)  # flow control or a tokenizer call: see `admit`
            return []
        try:
            received, headers = self._decoded()
            decision = self.director.decide(received, headers, _path(headers), self.subset, self.arrived)
        except RequestError as e:
            return self._fail(e)
        return self._routed(decision, received, phase=phase, more=more)

    def release_body(self) -> None:
        """Give back what the request body held of the budget; the pieces are no longer needed."""
        if self.budget is not None and self.held:
            self.budget.give(self.held)
            self.held = 0
            self.pieces = []

    def _decoded(self) -> tuple[bytes, dict[str, str]]:
        """The request body as its parser reads it, decoded from its Content-Encoding (and the
        headers without it), else as it came. Raises `RequestError`: 400 for a body that is not what
        its label says (routing it would have the model server fail on it), 413 past the limit."""
        body, headers = self.body, self.headers
        encoding = headers.get("content-encoding", "").strip().lower()
        if not encoding or encoding == "identity":
            return body, headers
        limit = self.director.max_body_bytes
        try:
            decoded = decode_body(body, encoding, limit)
        except BodyDecodeError as e:
            raise errors.bad_request(
                f"request body cannot be decoded as Content-Encoding {encoding}: {e}"
            ) from None
        except BodyTooLargeError:
            raise too_large(None, limit) from None
        self.decoded = True
        return decoded, {k: v for k, v in headers.items() if k != "content-encoding"}

    async def admit(self) -> list[pb.ProcessingResponse]:
        """Decide the pending routing asynchronously: ask the model server for tokens when a token
        producer does, and wait in flow control when it is on. The Envoy stream stays open meanwhile, and
        a refusal or expiry is answered with an immediate response. Cancelled (Envoy closed the
        stream): the request leaves its queue."""
        assert self.pending is not None
        phase, more = self.pending
        self.pending = None
        try:
            received, headers = self._decoded()
            decision = self.director.begin(received, headers, _path(headers), self.subset, self.arrived)
            await decision.admit()
        except RequestError as e:
            return self._fail(e)
        return self._routed(decision, received, phase=phase, more=more)

    def _routed(
        self, decision: RequestCycle, received: bytes, *, phase: str, more: bool
    ) -> list[pb.ProcessingResponse]:
        answers = self._routing_answers(decision, received, phase=phase, more=more)
        self.release_body()  # routed: what is forwarded is in the answers
        if self.decoded and (decision.body != received or self.modes.request_body == FULL_DUPLEX_STREAMED):
            _drop_encoding(answers)  # the body goes decoded
        if not more:
            self._end_early()
        return answers

    def _routing_answers(
        self, decision: RequestCycle, received: bytes, *, phase: str, more: bool
    ) -> list[pb.ProcessingResponse]:
        self.decision = decision
        if phase == "headers":
            return [self._override(_routed_headers(decision, content_length=None))]
        rewritten = decision.body != received
        if self.modes.request_body == FULL_DUPLEX_STREAMED:
            return [
                _routed_headers(decision, content_length=len(decision.body)),
                *messages.streamed_body("request_body", decision.body, end_of_stream=not more),
            ]
        answers: list[pb.ProcessingResponse] = []
        length = len(decision.body) if rewritten else None
        last = pb.ProcessingResponse()
        if self.modes.headers_wait_for_body:
            answers.append(_routed_headers(decision, content_length=length))
            answers.extend(_emptied_chunk() for _ in range(self.unanswered_chunks))
            last.request_body.response.SetInParent()
        else:
            messages.route(last.request_body.response, decision, content_length=length)
            messages.put_destinations(last.dynamic_metadata, decision)
        if rewritten or self.chunks > 1:
            last.request_body.response.body_mutation.body = decision.body
        answers.append(last)
        return answers

    # Asking for less of the response.

    def _override(self, answer: pb.ProcessingResponse) -> pb.ProcessingResponse:
        """`answer` (to the request headers), with a `mode_override` that asks for no more of the
        response than the service reads; unchanged when it reads the body, or Envoy would ignore one."""
        modes = self.modes
        if self.needs is ResponseNeeds.BODY or not modes.takes_override:
            return answer
        answer.mode_override.CopyFrom(
            _Mode(
                request_header_mode=SEND,
                request_body_mode=modes.request_body,
                response_header_mode=SEND if self.needs is ResponseNeeds.HEADERS else SKIP,
                response_body_mode=NONE,
                response_trailer_mode=SKIP,
            )
        )
        self.overridden = True
        return answer

    def _end_early(self) -> None:
        """Once the request is routed and passed on: when nothing of the response is read and Envoy
        would not take an override (full duplex, or the body sent early), end the stream; Envoy relays
        the response without epick."""
        if self.needs is not ResponseNeeds.NONE or self.closed or self.decision is None:
            return
        # Not under a FULL_DUPLEX_STREAMED response: Envoy drains each response chunk it sends to
        # epick, and drops the chunks it sent before it saw the stream end (onGrpcClose re-injects
        # only STREAMED's queued chunks); the chunks must be echoed back.
        if not self.modes.takes_override and self.modes.response_body != FULL_DUPLEX_STREAMED:
            self.closed = True
            self._complete(None)

    def _fail(self, error: RequestError, log_once: str | None = None) -> list[pb.ProcessingResponse]:
        if log_once is not None and log_once not in _logged_unroutable:
            _logged_unroutable.add(log_once)
            log.error("%s", error.message)
        self.closed = True
        self.release_body()
        return [messages.immediate(error)]

    # The response.

    def _response_headers(
        self, message: pb.HttpHeaders, metadata: dict[str, dict[str, object]]
    ) -> pb.ProcessingResponse:
        answer = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
        d = self.decision
        if d is None:
            return answer
        headers = messages.headers_of(message)
        raw_status = headers.get(":status", "")
        status = int(raw_status) if raw_status.isdigit() else 0  # 0: not known
        streaming = d.request.body.stream
        self.response = Response(
            d.request.request_id, status=status, headers=headers, streaming=streaming, metadata=metadata
        )
        d.received(self.response, self.endpoint)
        if self.response.add_headers:
            answer.response_headers.response.header_mutation.set_headers.extend(
                messages.header(k, v) for k, v in self.response.add_headers.items()
            )
        if message.end_of_stream and self._complete(None):
            self._attach_metadata(answer)
        return answer

    def _response_body(self, message: pb.HttpBody) -> list[pb.ProcessingResponse]:
        d, response = self.decision, self.response
        completed = False
        if d is not None and response is not None:
            response.chunk = message.body
            d.streamed(response, self.endpoint)
            if message.end_of_stream:
                completed = self._complete(None)
        if self.modes.response_body == FULL_DUPLEX_STREAMED:
            answers = messages.streamed_body(
                "response_body", message.body, end_of_stream=message.end_of_stream
            )
        else:
            answers = [pb.ProcessingResponse(response_body=pb.BodyResponse())]
        if completed:
            # As upstream: what the ResponseComplete hooks reported rides on the last body answer.
            self._attach_metadata(answers[-1])
        return answers

    def _attach_metadata(self, answer: pb.ProcessingResponse) -> None:
        """The response's dynamic metadata (what hooks reported once it completed), on `answer`."""
        if self.response is not None and self.response.dynamic_metadata:
            answer.dynamic_metadata.CopyFrom(messages.response_metadata(self.response))

    @property
    def endpoint(self) -> Endpoint:
        assert self.decision is not None
        return self.decision.targets[0]

    def _complete(self, error: str | None) -> bool:
        """Report the response complete, once; true when this call did."""
        d = self.decision
        if self.completed or d is None:
            return False
        self.completed = True
        response = self.response or Response(d.request.request_id, status=0)
        response.end_of_stream = True
        response.chunk = b""
        if error is not None and response.status == 0:
            response.error = error
        d.completed(response, self.endpoint)
        return True

    def abandon(self) -> None:
        """The stream ended: a response that did not finish is reported complete, with an error;
        unless epick asked for less than its body (`mode_override`): then the end of the stream is the
        end of the response."""
        self.release_body()
        if self.overridden and (self.response is not None or self.needs is ResponseNeeds.NONE):
            self._complete(None)
        else:
            self._complete("stream ended before the response did")


def _drop_encoding(answers: list[pb.ProcessingResponse]) -> None:
    """Remove Content-Encoding in the answer that carries the routing headers."""
    for answer in answers:
        for phase in ("request_headers", "request_body"):
            if answer.HasField(phase) and getattr(answer, phase).response.HasField("header_mutation"):
                getattr(answer, phase).response.header_mutation.remove_headers.append("content-encoding")
                return


def _routed_headers(decision: RequestCycle, *, content_length: int | None) -> pb.ProcessingResponse:
    """The answer to the request headers that carries the routing, and the destinations' metadata."""
    answer = pb.ProcessingResponse()
    messages.route(answer.request_headers.response, decision, content_length=content_length)
    messages.put_destinations(answer.dynamic_metadata, decision)
    return answer


def _emptied_chunk() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(
            response=pb.CommonResponse(body_mutation=pb.BodyMutation(clear_body=True))
        )
    )
