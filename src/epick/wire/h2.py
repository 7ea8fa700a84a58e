"""HTTP/2 (RFC 9113) on the wire: frame types, flags, settings, error codes, gRPC statuses, and
the frames and header blocks a server writes (HPACK without the dynamic table)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from urllib.parse import quote

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6) and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings (section 6.5.2).
SETTINGS_HEADER_TABLE_SIZE = 1
SETTINGS_MAX_CONCURRENT_STREAMS = 3
SETTINGS_INITIAL_WINDOW_SIZE = 4
SETTINGS_MAX_FRAME_SIZE = 5
SETTINGS_MAX_HEADER_LIST_SIZE = 6

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
# What epick offers: large windows and frames, so that a body chunk of Envoy's comes in one frame and
# window updates are rare; the peer is bounded by the message limit, not by the window.
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 16 * 1024 * 1024
FRAME_SIZE = 1024 * 1024
HEADER_LIST_BYTES = 64 * 1024
MAX_CACHED_BLOCKS = 64  # distinct header blocks remembered per connection
MESSAGE_BYTES = 4 * 1024 * 1024  # grpc's default receive limit


class H2Error(IntEnum):
    """HTTP/2 error codes (section 7)."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9


class Status(IntEnum):
    """The gRPC status codes epick answers with."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


PROTOCOL = H2Error.PROTOCOL_ERROR


class H2ConnectionError(Exception):
    """A connection error (RFC 9113 section 5.4.1): the connection ends with GOAWAY and the code."""

    def __init__(self, code: H2Error, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def _int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 section 5.1) with the given prefix and first-byte flags."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode("latin-1")
    return _int(len(raw), 7) + raw


def _literal(name: str, value: str) -> bytes:
    """A header field literal without indexing, with a new name (the dynamic table stays empty)."""
    return b"\x00" + _string(name) + _string(value)


# ":status: 200" is static entry 8; "content-type" is static entry 31, given as a literal without indexing.
RESPONSE_HEADERS = b"\x88" + _int(31, 4) + _string("application/grpc")
OK_TRAILERS = _literal("grpc-status", "0")


def trailers(status: Status | int, details: str = "") -> bytes:
    block = _literal("grpc-status", str(int(status)))
    if details:
        block += _literal("grpc-message", quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"))
    return block


def frame_bytes(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def settings_frame(values: Mapping[int, int]) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())
    return frame_bytes(SETTINGS, 0, 0, payload)


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame_bytes(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def rst_frame(stream_id: int, code: H2Error) -> bytes:
    return frame_bytes(RST_STREAM, 0, stream_id, int(code).to_bytes(4, "big"))


SETTINGS_ACK_FRAME = frame_bytes(SETTINGS, ACK, 0)
