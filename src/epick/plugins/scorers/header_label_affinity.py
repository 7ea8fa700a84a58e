"""`header-label-affinity-scorer`: prefer endpoints whose label equals a request header.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/headerlabelaffinity/plugin.go):
both parameters are required: `headerName` (matched lower-cased, as request header names are) and
`labelKey` (exact). An endpoint scores 1 when the header is present, not empty, and equal (untrimmed,
case-sensitive) to the endpoint's `labelKey` label; every other endpoint scores 0. It only scores,
never removes a candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "header-label-affinity-scorer"


class HeaderLabelAffinityParameters(Parameters):
    header_name: str = ""
    label_key: str = ""


class HeaderLabelAffinityScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS  # and the candidates' labels

    def __init__(self, name: str | None, header_name: str, label_key: str) -> None:
        super().__init__(name)
        self.header_name = header_name.lower()
        self.label_key = label_key

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        wanted = request.headers.get(self.header_name, "")
        if not wanted:
            return [0.0] * len(endpoints)
        key = self.label_key
        return [1.0 if ep.labels.get(key) == wanted else 0.0 for ep in endpoints]


def _factory(name: str, params: HeaderLabelAffinityParameters, handle: Handle) -> HeaderLabelAffinityScorer:
    if not params.model_fields_set:
        raise ParameterError(
            "headerName",
            "requires parameters: headerName and labelKey",
            "add parameters: {headerName: <request header>, labelKey: <endpoint label>}",
        )
    if not params.header_name:
        raise ParameterError("headerName", "headerName is required", "name the request header to match")
    if not params.label_key:
        raise ParameterError("labelKey", "labelKey is required", "name the endpoint label to match")
    return HeaderLabelAffinityScorer(name, params.header_name, params.label_key)


SPEC = PluginSpec(
    TYPE,
    _factory,
    HeaderLabelAffinityParameters,
    "1 for endpoints whose labelKey label equals the headerName header, else 0",
)
