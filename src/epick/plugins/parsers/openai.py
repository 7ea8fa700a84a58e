"""`openai-parser`: OpenAI's API, as llm-d's parser reads it (llm-d/llm-d-router,
pkg/epp/framework/plugins/requesthandling/parsers/openai).

Paths: chat/completions, completions, embeddings, responses, conversations, the render variants of
the first two, images/generations. The path says what the body is; each kind's required field is
checked (chat `messages`, completions `prompt`, responses `input`, conversations `items`, embeddings
`input`, images `prompt`). The prefix text is the prompt, or the structured input as compact JSON
(chat `messages`; responses `[{"instructions"}, {"tools"}, {"input"}]`, each present only when given;
conversations `items`; embeddings `input`). Usage is read from a JSON body's `usage`, from the
`usage` of an event-stream chunk (the client asks for it with `stream_options.include_usage`;
epick does not add it), and from the Responses API's `response.completed` event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epick.framework import BadRequestError, NamedPlugin, Reads, RequestBody, Usage
from epick.framework.parsing import H2C, HTTP, ParsedRequest, matches_suffix
from epick.framework.request import RequestKind, openai_body
from epick.plugins.parsers.common import (
    USAGE_MARKERS,
    compact_json,
    count_of,
    decode_object,
    event_data,
    json_or_none,
    model_of,
    openai_usage,
    salt_of,
    stream_of,
)
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "openai-parser"

PATHS = (
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "conversations",
    "chat/completions/render",
    "completions/render",
    "images/generations",
)


def kind_of(path: str) -> RequestKind:
    """The API a path names, in upstream's order of checks; a path it does not know is completions."""
    for suffix, kind in (
        ("conversations", "conversations"),
        ("responses", "responses"),
        ("chat/completions", "chat"),
        ("chat/completions/render", "chat"),
        ("completions", "completion"),
        ("completions/render", "completion"),
        ("embeddings", "embeddings"),
        ("images/generations", "images"),
    ):
        if matches_suffix(path, suffix):
            return kind  # type: ignore[return-value]
    return "completion"


class OpenAIParser(NamedPlugin):
    plugin_type = TYPE
    protocols = (H2C, HTTP)  # the InferencePool appProtocols it serves (upstream's claims)
    reads = Reads.NOTHING  # parsers read requests before scheduling; no scheduling result depends on them
    usage_markers = USAGE_MARKERS  # the stream lines `event_data` reads

    @property
    def paths(self) -> tuple[str, ...]:
        return PATHS

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        raw = decode_object(body)
        return parse_openai(raw, kind_of(path))

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        return openai_response_usage(data, streaming)


def parse_openai(raw: dict[str, Any], kind: RequestKind) -> ParsedRequest:
    """A decoded OpenAI body of the given kind."""
    model = model_of(raw)
    if not model:
        raise BadRequestError("request body has no 'model' (a non-empty string is required)")
    if kind in ("chat", "completion"):
        return ParsedRequest(openai_body(raw, kind), model, raw)
    stream = stream_of(raw)
    salt = salt_of(raw)
    max_tokens: int | None = None
    text: str | None = None  # the prefix text when it is a plain string
    source: Any = None  # else the structured input it is spelt from
    if kind == "responses":
        if raw.get("input") is None:
            raise BadRequestError("responses request needs 'input'")
        parts = [{k: raw[k]} for k in ("instructions", "tools") if raw.get(k) is not None]
        source = [*parts, {"input": raw["input"]}]
        max_tokens = count_of(raw, "max_output_tokens")
    elif kind == "conversations":
        items = raw.get("items")
        if not isinstance(items, list) or not items:
            raise BadRequestError("conversations request needs 'items': a non-empty list")
        source = items
    elif kind == "embeddings":
        value = raw.get("input")
        if value is None or value in ("", []):
            raise BadRequestError("embeddings request needs 'input'")
        if not isinstance(value, str | list):
            raise BadRequestError("'input' must be a string, a list of strings or a list of token ids")
        source = value
    else:  # images
        prompt = raw.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadRequestError("image generation request needs 'prompt': a non-empty string")
        text = prompt

    def spell() -> str:
        return text if text is not None else compact_json(source)

    body = RequestBody(
        kind=kind, stream=stream, cache_salt=salt, max_tokens=max_tokens, source=spell, raw=raw
    )
    return ParsedRequest(body, model, raw)


def openai_response_usage(data: bytes, streaming: bool) -> Usage | None:
    if not data:
        return None
    if not streaming:
        doc = json_or_none(data)
        return openai_usage(doc.get("usage")) if isinstance(doc, dict) else None
    for event in event_data(data):
        if not isinstance(event, dict):
            continue
        if event.get("usage") is not None:
            return openai_usage(event["usage"])
        if event.get("type") == "response.completed":
            response = event.get("response")
            if isinstance(response, dict) and response.get("usage") is not None:
                return openai_usage(response["usage"])
    return None


def _factory(name: str, params: NoParameters, handle: Handle) -> OpenAIParser:
    return OpenAIParser(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "OpenAI: completions, chat, responses, embeddings, ...")
