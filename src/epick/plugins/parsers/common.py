"""What the parsers share: reading a JSON body, its optional fields, event-stream lines and usage."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from epick.framework import BadRequestError, Usage, jsontext


def decode_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; `BadRequestError` naming what is wrong otherwise."""
    try:
        raw = jsontext.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequestError(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequestError("request body is not valid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. a number of more digits than Python converts
        raise BadRequestError(f"request body cannot be read as JSON: {e}") from None
    if not isinstance(raw, dict):
        raise BadRequestError("request body must be a JSON object")
    return raw


def compact_json(value: Any) -> str:
    """The text a structured input is hashed as: compact JSON, keys in their order, text unescaped."""
    return jsontext.compact(value)


def model_of(raw: Mapping[str, Any]) -> str:
    model = raw.get("model")
    return model if isinstance(model, str) else ""


def stream_of(raw: Mapping[str, Any]) -> bool:
    value = raw.get("stream")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequestError("'stream' must be a boolean")
    return value


def salt_of(raw: Mapping[str, Any], key: str = "cache_salt") -> str:
    value = raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequestError(f"'{key}' must be a string")
    return value


def count_of(raw: Mapping[str, Any] | None, *keys: str) -> int | None:
    """The first of `keys` holding a non-negative whole number (upstream's MaxOutputTokensFromPayload:
    a value of another type, negative or fractional, is passed over)."""
    if raw is None:
        return None
    for key in keys:
        value = raw.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and value >= 0:
            return value
        if isinstance(value, float) and value >= 0 and value.is_integer():
            return int(value)
    return None


def token_ids(value: Any, field: str) -> tuple[int, ...]:
    """A flat list of token ids (whole numbers 0 .. 2**32-1)."""
    if not isinstance(value, list):
        raise BadRequestError(f"'{field}' must be a list of token ids")
    out = []
    for i, v in enumerate(value):
        n = int(v) if isinstance(v, float) and v.is_integer() else v
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**32:
            raise BadRequestError(f"'{field}[{i}]' must be a token id (a whole number from 0 to 2**32-1)")
        out.append(n)
    return tuple(out)


# A stretch of event stream holding none of these holds no usage for `event_data`'s readers: a parser
# that says so (`usage_markers`) spares the usage reader a parse of every chunk.
USAGE_MARKERS = (b"usage", b"meta_info")


def event_data(data: bytes) -> Iterator[Any]:
    """The JSON of each `data: ` line of an event stream that mentions usage (others are skipped)."""
    for raw in data.split(b"\n"):
        line = raw.rstrip(b"\r")
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]" or (b"usage" not in payload and b"meta_info" not in payload):
            continue
        try:
            yield jsontext.loads(payload)
        except ValueError:
            continue


def number(value: Any) -> int:
    """A token count as upstream's toInt reads it: a number or a numeric string; anything else is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(float(value))
        except ValueError:
            return 0
    return 0


def openai_usage(usage: Any) -> Usage | None:
    """OpenAI's usage object (chat, completions, embeddings; or responses' input/output names)."""
    if not isinstance(usage, Mapping):
        return None

    def first(*keys: str) -> int:
        for key in keys:
            if usage.get(key) is not None:
                return number(usage[key])
        return 0

    cached = 0
    for details in ("prompt_tokens_details", "input_tokens_details"):
        d = usage.get(details)
        if isinstance(d, Mapping) and d.get("cached_tokens") is not None:
            cached = number(d["cached_tokens"])
    return Usage(
        prompt_tokens=first("prompt_tokens", "input_tokens"),
        completion_tokens=first("completion_tokens", "output_tokens"),
        cached_tokens=cached,
    )


def json_or_none(data: bytes) -> Any:
    try:
        return jsontext.loads(data)
    except (ValueError, RecursionError):
        return None
