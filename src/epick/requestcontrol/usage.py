"""Reading a response's token usage with the parser that read its request.

An event stream (`text/event-stream`) is read as it arrives, line by line: a line split between two
chunks is kept until its end arrives, so no `data:` line is lost or misread. A chunk of whole lines
that holds none of the parser's `usage_markers` (the usual chunk: one token's event) is passed over
without a parse. Any other body is kept
(up to a limit) and read once, at its end. The usage found is merged into `Response.usage` as upstream
merges it (a later non-zero count replaces an earlier one).
"""

from __future__ import annotations

from epick.framework import Parser, Response, merge_usage

EVENT_STREAM = "text/event-stream"
MAX_LINE = 1 << 20  # a longer unfinished line is dropped: usage lines are short


class UsageReader:
    def __init__(self, parser: Parser, max_body_bytes: int) -> None:
        self._parser = parser
        # Whole stream lines holding none of these are skipped unread (a parser's `usage_markers`).
        self._markers: tuple[bytes, ...] | None = getattr(parser, "usage_markers", None)
        self._limit = max_body_bytes
        self._streaming = False
        self._buffer = bytearray()
        self._overflow = False

    def start(self, response: Response) -> None:
        """The response's headers have arrived (for another attempt, perhaps): is it an event stream?"""
        self._buffer.clear()
        self._overflow = False
        content_type = next((v for k, v in response.headers.items() if k.lower() == "content-type"), "")
        self._streaming = EVENT_STREAM in content_type.lower()

    def feed(self, response: Response) -> None:
        """One more chunk (`response.chunk`)."""
        chunk = response.chunk
        if not chunk or self._overflow:
            return
        markers = self._markers
        if markers is not None and self._streaming and not self._buffer and chunk.endswith(b"\n"):
            for marker in markers:
                if marker in chunk:
                    break
            else:
                return  # whole lines, and none can hold usage: the common chunk of a stream
        if not self._streaming:
            if len(self._buffer) + len(chunk) > self._limit:
                self._overflow = True
                self._buffer.clear()
            else:
                self._buffer += chunk
            return
        self._buffer += chunk
        end = self._buffer.rfind(b"\n")
        if end < 0:
            if len(self._buffer) > MAX_LINE:
                self._buffer.clear()
            return
        lines = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        self._read(lines, response)

    def finish(self, response: Response) -> None:
        """The response has ended: read what is left (a whole body, or a stream's last line)."""
        if response.chunk and not self._streaming and not self._buffer and not self._overflow:
            self._buffer += response.chunk  # a front end that hands the whole body over at the end
        if self._buffer and not self._overflow:
            self._read(bytes(self._buffer), response)
        self._buffer.clear()

    def _read(self, data: bytes, response: Response) -> None:
        try:
            usage = self._parser.parse_response(data, self._streaming)
        except Exception:  # a parser's bug must not fail the response it observes
            return
        response.usage = merge_usage(response.usage, usage)
