"""OpenAI-style error bodies, as vLLM's server returns them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAILURE_TYPES = ("rate_limit", "server_error", "invalid_request", "context_length", "model_not_found")


@dataclass(frozen=True, slots=True)
class APIError(Exception):
    status: int
    message: str
    type: str
    code: str | int | None = None  # OpenAI's string codes; vLLM's own endpoints put the HTTP status
    param: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "BadRequestError", None, param)


def with_status_code(error: APIError) -> APIError:
    """The error as vLLM's own endpoints (/tokenize, /detokenize) write it: `code` is the status."""
    return APIError(error.status, error.message, error.type, error.status, error.param)


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", "NotFoundError", "model_not_found", "model")


def context_length(max_model_len: int, prompt_tokens: int, max_tokens: int) -> APIError:
    return APIError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
        "completion). Please reduce the length of the messages or completion.",
        "BadRequestError",
        "context_length_exceeded",
        "messages",
    )


def injected(kind: str, model: str, max_model_len: int) -> APIError:
    """The error `--failure-types` names, as a real server would send it."""
    if kind == "rate_limit":
        return APIError(429, "Rate limit reached for requests", "rate_limit_error", "rate_limit_exceeded")
    if kind == "server_error":
        return APIError(
            503, "The server is overloaded or not ready yet.", "server_error", "service_unavailable"
        )
    if kind == "invalid_request":
        return APIError(400, "Invalid request: the request could not be processed", "invalid_request_error")
    if kind == "context_length":
        return context_length(max_model_len, max_model_len, 1)
    if kind == "model_not_found":
        return model_not_found(model)
    raise ValueError(f"unknown failure type {kind!r}; choose from {', '.join(FAILURE_TYPES)}")
