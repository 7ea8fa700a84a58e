"""`models-data-source` and `models-data-extractor`: the models each endpoint serves, from its
OpenAI `/v1/models` list.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/source/models and
extractor/models): the source polls `GET /v1/models` (the HTTP source parameters, no port override);
the extractor sets "/v1/models/models-data-extractor" to the served models, in the response's order,
each `(id, parent)` (a LoRA adapter's `parent` is its base model, "" for a base model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import Field

from epick.framework import Endpoint, NamedPlugin, Reads
from epick.framework.datalayer import Extracted, ExtractError, Payload, data_key
from epick.plugins.datalayer.http_source import HTTPSource, HTTPSourceParameters
from epick.plugins.registry import Handle, PluginSpec

SOURCE_TYPE = "models-data-source"
EXTRACTOR_TYPE = "models-data-extractor"
MODELS_KEY = data_key("/v1/models", EXTRACTOR_TYPE)


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    parent: str = ""


class ModelsSourceParameters(HTTPSourceParameters):
    path: str = Field(default="/v1/models")


class ModelsDataSource(HTTPSource):
    plugin_type = SOURCE_TYPE
    kind = "json"


class ModelsDataExtractor(NamedPlugin):
    plugin_type = EXTRACTOR_TYPE
    reads = Reads.NOTHING

    @property
    def accepts(self) -> Payload:
        return "json"

    def extract(self, payload: str | object, endpoint: Endpoint, now: float) -> Extracted:
        if not isinstance(payload, Mapping) or not isinstance(payload.get("data"), list):
            raise ExtractError("a /v1/models response is an object with a 'data' list")
        models: list[ServedModel] = []
        for i, item in enumerate(payload["data"]):
            if not isinstance(item, Mapping) or not isinstance(item.get("id"), str) or not item["id"]:
                raise ExtractError(f"/v1/models data[{i}] has no 'id' string")
            parent = item.get("parent")
            models.append(ServedModel(item["id"], parent if isinstance(parent, str) else ""))
        return Extracted(None, {MODELS_KEY: tuple(models)})


def _source(name: str, params: ModelsSourceParameters, handle: Handle) -> ModelsDataSource:
    return ModelsDataSource(name, params)


def _extractor(name: str, params: object, handle: Handle) -> ModelsDataExtractor:
    return ModelsDataExtractor(name)


SOURCE_SPEC = PluginSpec(SOURCE_TYPE, _source, ModelsSourceParameters, "polls each endpoint's /v1/models")
EXTRACTOR_SPEC = PluginSpec(EXTRACTOR_TYPE, _extractor, summary="the models an endpoint serves")
