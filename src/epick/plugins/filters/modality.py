"""`modality-filter` (llm-d): keep the endpoints whose model architecture serves the request's API.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/modality and the
constants of pkg/common, as found through the code search; the commit that registers it was not
established). The request's path (Envoy's `:path`, its query removed; the proxy's requests carry it
as well) names the architectures that can answer it, and an endpoint's label `llm-d.ai/model-arch`
names its own:

| path | architectures |
|---|---|
| `/v1/audio/speech` | `omni-llm`, `autoregressive-tts` |
| `/v1/audio/transcriptions` | `encoder-decoder-stt` |
| `/v1/images/generations` | `diffusion` |

For those paths only the endpoints labelled with one of them pass (an endpoint without the label
does not); any other path passes every endpoint. No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "modality-filter"
MODEL_ARCH_LABEL = "llm-d.ai/model-arch"
PATH_ARCHITECTURES: dict[str, frozenset[str]] = {
    "/v1/audio/speech": frozenset({"omni-llm", "autoregressive-tts"}),
    "/v1/audio/transcriptions": frozenset({"encoder-decoder-stt"}),
    "/v1/images/generations": frozenset({"diffusion"}),
}


class ModalityFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS  # the path, and the endpoints' labels

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        path = request.headers.get(":path", "").split("?", 1)[0]
        architectures = PATH_ARCHITECTURES.get(path)
        if architectures is None:
            return list(endpoints)
        return [ep for ep in endpoints if ep.labels.get(MODEL_ARCH_LABEL) in architectures]


def _factory(name: str, params: NoParameters, handle: Handle) -> ModalityFilter:
    return ModalityFilter(name)


SPEC = PluginSpec(
    TYPE, _factory, NoParameters, "only endpoints whose model architecture serves the path", worker_state=""
)
