"""`anthropic-parser`: Anthropic's Messages API (llm-d/llm-d-router,
pkg/epp/framework/plugins/requesthandling/parsers/anthropic).

Paths: messages, messages/count_tokens. A count_tokens body is forwarded unread, and its response not
read. A messages body needs `model` and a non-empty `messages` list; `max_tokens` and `stream` are read.
The prefix text is compact JSON of `system`, `tools` and `messages` (those given, in that order).
Usage: a JSON body's `usage.input_tokens`, `output_tokens` and `cache_read_input_tokens`; in an event
stream, `message_start` carries the input (and cached) tokens and `message_delta` the output tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epick.framework import BadRequestError, ChatMessage, NamedPlugin, Reads, RequestBody, Usage
from epick.framework.parsing import H2C, HTTP, ParsedRequest
from epick.plugins.parsers.common import (
    USAGE_MARKERS,
    compact_json,
    count_of,
    decode_object,
    event_data,
    json_or_none,
    model_of,
    salt_of,
    stream_of,
)
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "anthropic-parser"


class AnthropicParser(NamedPlugin):
    plugin_type = TYPE
    protocols = (H2C, HTTP)  # the InferencePool appProtocols it serves (upstream's claims)
    reads = Reads.NOTHING  # parsers read requests before scheduling; no scheduling result depends on them
    usage_markers = USAGE_MARKERS  # the stream lines `event_data` reads

    @property
    def paths(self) -> tuple[str, ...]:
        return ("messages", "messages/count_tokens")

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        if path.endswith("/messages/count_tokens"):
            return ParsedRequest(RequestBody(kind="raw", source=""), "", None, skip_response=True)
        if not path.endswith("/messages"):
            raise BadRequestError(f"unsupported Anthropic API path: {path}")
        raw = decode_object(body)
        model = model_of(raw)
        if not model:
            raise BadRequestError("request body has no 'model' (a non-empty string is required)")
        messages = raw.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("messages request needs 'messages': a non-empty list")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
                raise BadRequestError(f"messages[{i}] must be an object with a string 'role'")
            if not isinstance(m.get("content"), str | list):
                raise BadRequestError(f"messages[{i}].content must be a string or a list of content blocks")
        system = raw.get("system")
        if system is not None and not isinstance(system, str | list):
            raise BadRequestError("'system' must be a string or a list of content blocks")
        parts: dict[str, Any] = {k: raw[k] for k in ("system", "tools") if raw.get(k) is not None}
        parts["messages"] = messages

        def spell() -> str:
            return compact_json(parts)

        body_ = RequestBody(
            kind="messages",
            messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages),
            stream=stream_of(raw),
            cache_salt=salt_of(raw),
            max_tokens=count_of(raw, "max_tokens"),
            source=spell,
            raw=raw,
        )
        return ParsedRequest(body_, model, raw)

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        if not data:
            return None
        if not streaming:
            doc = json_or_none(data)
            usage = doc.get("usage") if isinstance(doc, dict) else None
            return _usage(usage, Usage()) if isinstance(usage, dict) else None
        found: Usage | None = None
        for event in event_data(data):
            if not isinstance(event, dict):
                continue
            if event.get("type") == "message_start":
                message = event.get("message")
                usage = message.get("usage") if isinstance(message, dict) else None
            elif event.get("type") == "message_delta":
                # Only the output count, as upstream reads it: a server may send input_tokens 0 here
                # (SGLang does), which must not wipe out message_start's counts.
                delta = event.get("usage")
                usage = {"output_tokens": delta.get("output_tokens")} if isinstance(delta, dict) else None
            else:
                continue
            if isinstance(usage, dict):
                found = _usage(usage, found or Usage())
        return found


def _usage(usage: dict[str, Any], into: Usage) -> Usage:
    """Anthropic's counts, JSON numbers only, onto `into` (a count absent here is left as it was)."""

    def count(key: str) -> int | None:
        value = usage.get(key)
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    if (n := count("input_tokens")) is not None:
        into.prompt_tokens = n
    if (n := count("output_tokens")) is not None:
        into.completion_tokens = n
    if (n := count("cache_read_input_tokens")) is not None:
        into.cached_tokens = n
    return into


def _factory(name: str, params: NoParameters, handle: Handle) -> AnthropicParser:
    return AnthropicParser(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "Anthropic Messages: /v1/messages, count_tokens")
