"""`sglanghttp-parser`: SGLang's native `/generate` endpoint with a pre-tokenized prompt
(llm-d/llm-d-router, pkg/epp/framework/plugins/requesthandling/parsers/sglanghttp).

The path must be exactly `/generate`. The body needs `input_ids`: one flat, non-empty list of token ids
(a batch of several prompts is refused, as upstream refuses it). `extra_key` is the cache salt,
`sampling_params.max_new_tokens` the output limit, `stream` read. SGLang's body names no model, and it
is forwarded as sent (never rewritten). Usage is in `meta_info` (`prompt_tokens`,
`completion_tokens`, `cached_tokens`): of the JSON body, or of the event whose `meta_info.finish_reason`
is set in a stream.
"""

from __future__ import annotations

from collections.abc import Mapping

from epick.framework import BadRequestError, NamedPlugin, Reads, RequestBody, Usage
from epick.framework.parsing import H2C, HTTP, ParsedRequest
from epick.plugins.parsers.common import (
    USAGE_MARKERS,
    count_of,
    decode_object,
    event_data,
    json_or_none,
    number,
    stream_of,
    token_ids,
)
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "sglanghttp-parser"


class SglangHttpParser(NamedPlugin):
    plugin_type = TYPE
    protocols = (H2C, HTTP)  # the InferencePool appProtocols it serves (upstream's claims)
    reads = Reads.NOTHING  # parsers read requests before scheduling; no scheduling result depends on them
    usage_markers = USAGE_MARKERS  # the stream lines `event_data` reads

    @property
    def paths(self) -> tuple[str, ...]:
        return ("generate",)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        if path.strip().rstrip("/") not in ("/generate", "generate"):
            raise BadRequestError(f"unsupported path for SGLang's generate API: {path} (only /generate)")
        raw = decode_object(body)
        ids = raw.get("input_ids")
        if ids is None:
            raise BadRequestError("generate request needs 'input_ids' (text and input_embeds are not read)")
        if not isinstance(ids, list) or any(isinstance(v, list) for v in ids):
            raise BadRequestError("'input_ids' must be one list of token ids (a batch is not supported)")
        if not ids:
            raise BadRequestError("'input_ids' cannot be empty")
        tokens = token_ids(ids, "input_ids")
        salt = raw.get("extra_key")
        if salt is not None and not isinstance(salt, str):
            raise BadRequestError("'extra_key' must be a string")
        sampling = raw.get("sampling_params")
        body_ = RequestBody(
            kind="generate",
            stream=stream_of(raw),
            cache_salt=salt or "",
            max_tokens=count_of(sampling if isinstance(sampling, Mapping) else None, "max_new_tokens"),
            source=lambda: " ".join(map(str, tokens)),
            token_ids=tokens,
        )
        return ParsedRequest(body_, "", None)

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        if not data:
            return None
        if not streaming:
            doc = json_or_none(data)
            return _usage(doc.get("meta_info")) if isinstance(doc, dict) else None
        for event in event_data(data):
            meta = event.get("meta_info") if isinstance(event, dict) else None
            if isinstance(meta, dict) and meta.get("finish_reason") is not None:
                return _usage(meta)
        return None


def _usage(meta: object) -> Usage | None:
    if not isinstance(meta, dict) or (
        meta.get("prompt_tokens") is None and meta.get("completion_tokens") is None
    ):
        return None
    return Usage(
        prompt_tokens=number(meta.get("prompt_tokens")),
        completion_tokens=number(meta.get("completion_tokens")),
        cached_tokens=number(meta.get("cached_tokens")),
    )


def _factory(name: str, params: NoParameters, handle: Handle) -> SglangHttpParser:
    return SglangHttpParser(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "SGLang's /generate (input_ids)")
