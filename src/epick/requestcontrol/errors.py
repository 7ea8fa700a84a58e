"""Errors a front end returns to the client, with the status the Go EPP gives each (GIE,
docs/proposals/004-endpoint-picker-protocol/README.md), and an OpenAI-shaped JSON body."""

from __future__ import annotations

import json
from dataclasses import dataclass

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


@dataclass(frozen=True, slots=True)
class RequestError(Exception):
    status: int
    message: str
    code: str
    headers: tuple[tuple[str, str], ...] = ()  # extra response headers (e.g. why it was dropped)

    def body(self) -> bytes:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return json.dumps({"error": {"message": self.message, "type": kind, "code": self.code}}).encode()

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


def bad_request(message: str) -> RequestError:
    return RequestError(400, message, "bad_request")


def too_large(size: int | None, limit: int) -> RequestError:
    """`size` None: not known (a chunked body stopped at the limit)."""
    body = "request body" if size is None else f"request body of {size} bytes"
    return RequestError(413, f"{body} exceeds the limit of {limit} bytes", "body_too_large")


def unknown_model(model: str, known: list[str]) -> RequestError:
    return RequestError(
        404,
        f"model {model!r} is not served by any endpoint (served: {', '.join(known) or 'none'})",
        "model_not_found",
    )


def no_endpoints(message: str = "no ready endpoint to serve the request") -> RequestError:
    return RequestError(503, message, "no_endpoints")


def shed(message: str) -> RequestError:
    return RequestError(429, message, "shed")


def no_parser(path: str, accepted: list[str]) -> RequestError:
    """No configured parser claims `path` (and none is a fallback)."""
    served = ", ".join(accepted) or "none"
    return RequestError(
        404,
        f"no parser accepts the path {path!r}; the configured parsers accept paths ending in {served}",
        "path_not_served",
    )


def bodies_held() -> RequestError:
    """A body refused because the bodies already held at once are at the budget (try again)."""
    return RequestError(
        503,
        "too many request bytes are being received at once; try again",
        "bodies_held",
        (("retry-after", "1"),),
    )
