"""`served-model-filter` (llm-d, Alpha): keep the endpoints whose model server lists the requested
model at `GET /v1/models`.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/servedmodel: filter.go
and README.md, as the PR that adds it reads; not in the commits epick follows otherwise). The lists
come from `models-data-extractor` under a `models-data-source` (each `(id, parent)`; vLLM lists its
base model and every LoRA adapter registered with it, an adapter with its `parent`). For a request
whose target model is X:

- endpoints that list X are kept. When X is a base model (no listing endpoint gives it a parent),
  endpoints without a stored list are kept too (`onMissing: Pass`, the default): every endpoint
  serving a base model lists it, so they have simply not reported yet. For an adapter they are
  dropped: an endpoint that has not reported is unlikely to have it registered;
- when no endpoint lists X, the endpoints without a list are kept (`Pass`); with `onMissing: Fail`,
  or none without a list, nothing is kept and the request fails (503), unless `fallbackOnEmpty`
  returns every candidate;
- a request without a target model passes unfiltered.

Counted in llm_d_epp_served_model_filter_decisions_total{plugin_name, outcome} (`listed`,
`unlisted`, `fallback`, `empty`, `not_applicable`), llm_d_epp_served_model_filter_candidates_total
and llm_d_epp_served_model_filter_unlisted_candidates_total{plugin_name}.

Upstream fails at start-up when the config has no `models-data-extractor` (the filter's required
data); so does epick, naming the plugins to add. Its state is nothing but those counters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.metrics import LLMD_SUBSYSTEM, MetricSample
from epick.plugins.datalayer.models import EXTRACTOR_TYPE, MODELS_KEY, ServedModel
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "served-model-filter"
OUTCOMES = ("listed", "unlisted", "fallback", "empty", "not_applicable")


class ServedModelParameters(Parameters):
    on_missing: str = "Pass"
    fallback_on_empty: bool = False


class ServedModelFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS | Reads.MODEL  # the lists the data layer stored, the target model

    def __init__(self, name: str | None = None, params: ServedModelParameters | None = None) -> None:
        super().__init__(name)
        self.params = params or ServedModelParameters()
        self.pass_on_missing = self.params.on_missing != "Fail"
        self.decisions: dict[str, int] = {}  # outcome -> decisions
        self.candidates = 0
        self.unlisted_candidates = 0

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        outcome, kept = self._decide(request.target_model, endpoints)
        self.decisions[outcome] = self.decisions.get(outcome, 0) + 1
        return kept

    def _decide(self, model: str, endpoints: Sequence[Endpoint]) -> tuple[str, list[Endpoint]]:
        if not model:
            return "not_applicable", list(endpoints)
        serving: list[Endpoint] = []
        unlisted: list[Endpoint] = []
        adapter = False
        for ep in endpoints:
            listed = ep.attribute(MODELS_KEY)
            if not isinstance(listed, tuple):
                unlisted.append(ep)
                continue
            found = next((m for m in listed if isinstance(m, ServedModel) and m.id == model), None)
            if found is not None:
                serving.append(ep)
                adapter = adapter or bool(found.parent)  # vLLM gives adapters a parent, base models none
        self.candidates += len(endpoints)
        self.unlisted_candidates += len(unlisted)
        if serving:
            return "listed", serving + unlisted if self.pass_on_missing and not adapter else serving
        if self.pass_on_missing and unlisted:
            return "unlisted", unlisted
        if self.params.fallback_on_empty:
            return "fallback", list(endpoints)
        return "empty", []

    # ExportsMetrics
    def metric_samples(self) -> Iterator[MetricSample]:
        labels = (("plugin_name", self.name),)
        for outcome, count in sorted(self.decisions.items()):
            yield MetricSample(
                f"{LLMD_SUBSYSTEM}_served_model_filter_decisions",
                "[ALPHA] Served model filter decisions, by outcome.",
                "counter",
                float(count),
                labels=(*labels, ("outcome", outcome)),
                plugin_labels=False,
            )
        yield MetricSample(
            f"{LLMD_SUBSYSTEM}_served_model_filter_candidates",
            "[ALPHA] Candidate endpoints the served model filter evaluated.",
            "counter",
            float(self.candidates),
            labels=labels,
            plugin_labels=False,
        )
        yield MetricSample(
            f"{LLMD_SUBSYSTEM}_served_model_filter_unlisted_candidates",
            "[ALPHA] Candidate endpoints without a stored model list.",
            "counter",
            float(self.unlisted_candidates),
            labels=labels,
            plugin_labels=False,
        )


def _factory(name: str, params: ServedModelParameters, handle: Handle) -> ServedModelFilter:
    if params.on_missing not in ("Pass", "Fail"):
        message = f'{TYPE} onMissing must be "Pass" or "Fail", got "{params.on_missing}"'
        raise ParameterError("onMissing", message, "use Pass or Fail")
    try:
        handle.plugin(EXTRACTOR_TYPE)
    except LookupError:
        raise ParameterError(
            "",
            f"{TYPE} reads the /v1/models lists of a '{EXTRACTOR_TYPE}', and this config has none",
            f"add plugins 'models-data-source' and '{EXTRACTOR_TYPE}', the extractor listed under the "
            "source in dataLayer.sources",
        ) from None
    return ServedModelFilter(name, params)


SPEC = PluginSpec(
    TYPE,
    _factory,
    ServedModelParameters,
    "only endpoints whose /v1/models lists the requested model",
    worker_state="",
)
