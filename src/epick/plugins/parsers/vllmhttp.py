"""`vllmhttp-parser`: vLLM's own HTTP generate endpoint, `/inference/v1/generate`, which takes a
pre-tokenized prompt (llm-d/llm-d-router, pkg/epp/framework/plugins/requesthandling/parsers/vllmhttp).

The body needs a non-empty `token_ids` list of token ids; `model`, `cache_salt`, `stream`,
`sampling_params.max_tokens` and multimodal `features` (`mm_hashes`, `mm_placeholders`) are read, the
rest forwarded as sent. The prefix text is the token ids in decimal, so equal token prefixes match.
Responses carry OpenAI's usage and are read as `openai-parser` reads them. Only this path is claimed:
list `openai-parser` too to serve the OpenAI paths on the same route.
"""

from __future__ import annotations

from collections.abc import Mapping

from epick.framework import BadRequestError, NamedPlugin, Reads, RequestBody, Usage
from epick.framework.parsing import H2C, HTTP, ParsedRequest
from epick.plugins.parsers.common import (
    USAGE_MARKERS,
    count_of,
    decode_object,
    model_of,
    salt_of,
    stream_of,
    token_ids,
)
from epick.plugins.parsers.openai import openai_response_usage
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "vllmhttp-parser"
PATH = "inference/v1/generate"


class VllmHttpParser(NamedPlugin):
    plugin_type = TYPE
    protocols = (H2C, HTTP)  # the InferencePool appProtocols it serves (upstream's claims)
    reads = Reads.NOTHING  # parsers read requests before scheduling; no scheduling result depends on them
    usage_markers = USAGE_MARKERS  # the stream lines `event_data` reads

    @property
    def paths(self) -> tuple[str, ...]:
        return (PATH,)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        if not path.rstrip("/").endswith(PATH):
            raise BadRequestError(f"unsupported path for vLLM's generate API: {path}")
        raw = decode_object(body)
        if raw.get("token_ids") in (None, []):
            raise BadRequestError("generate request needs 'token_ids': a non-empty list of token ids")
        ids = token_ids(raw["token_ids"], "token_ids")
        features = raw.get("features")
        if features is not None and not isinstance(features, Mapping):
            raise BadRequestError("'features' must be an object (mm_hashes, mm_placeholders)")
        sampling = raw.get("sampling_params")
        if sampling is not None and not isinstance(sampling, Mapping):
            raise BadRequestError("'sampling_params' must be an object")
        model = model_of(raw)
        if not model:
            raise BadRequestError("request body has no 'model' (a non-empty string is required)")
        body_ = RequestBody(
            kind="generate",
            stream=stream_of(raw),
            cache_salt=salt_of(raw),
            max_tokens=count_of(sampling, "max_tokens"),
            source=lambda: " ".join(map(str, ids)),
            token_ids=ids,
            raw=raw,
        )
        return ParsedRequest(body_, model, raw)

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        return openai_response_usage(data, streaming)


def _factory(name: str, params: NoParameters, handle: Handle) -> VllmHttpParser:
    return VllmHttpParser(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "vLLM's /inference/v1/generate (token ids)")
