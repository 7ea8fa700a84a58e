"""served-model-filter: endpoints whose /v1/models list names the requested model (llm-d-router's
servedmodel filter and its README's behaviour table)."""

from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState, Endpoint
from epick.plugins.datalayer.models import MODELS_KEY, ServedModel
from epick.plugins.filters.served_model import ServedModelFilter, ServedModelParameters
from tests.builders import make_endpoint, make_request

BASE = "meta-llama/Llama-3.1-8B-Instruct"


def listing(name: str, *models: ServedModel) -> Endpoint:
    return make_endpoint(name).with_attributes({MODELS_KEY: models})


A = listing("A", ServedModel(BASE), ServedModel("sql-lora", BASE))
B = make_endpoint("B")  # has not reported a list yet
C = listing("C", ServedModel("other-model"))
D = listing("D", ServedModel(BASE))


def kept(f: ServedModelFilter, model: str, *endpoints: Endpoint) -> list[str]:
    # A passthrough-style request has no target model (the OpenAI parser refuses one without).
    request = replace(make_request(), target_model=model)
    return [ep.name for ep in f.filter(request, CycleState(), list(endpoints))]


def fail(**params: object) -> ServedModelFilter:
    return ServedModelFilter(params=ServedModelParameters.model_validate({"onMissing": "Fail", **params}))


def test_a_base_model_keeps_its_listers_and_the_endpoints_not_yet_reported() -> None:
    f = ServedModelFilter()
    assert kept(f, BASE, A, B, C, D) == ["A", "D", "B"]  # C lists another model only
    assert kept(fail(), BASE, A, B, C, D) == ["A", "D"]
    assert f.decisions == {"listed": 1}


def test_an_adapter_keeps_only_its_listers() -> None:
    """An endpoint that has not reported is unlikely to have the adapter another one lists."""
    assert kept(ServedModelFilter(), "sql-lora", A, B, C, D) == ["A"]


def test_when_no_endpoint_lists_the_model() -> None:
    f = ServedModelFilter()
    assert kept(f, "nowhere", A, B, C) == ["B"]  # only those that may still list it
    assert f.decisions == {"unlisted": 1}
    empty = fail()
    assert kept(empty, "nowhere", A, B, C) == []  # the request fails (503)
    assert kept(ServedModelFilter(), "nowhere", A, C) == []
    assert empty.decisions == {"empty": 1}
    fallback = fail(fallbackOnEmpty=True)
    assert kept(fallback, "nowhere", A, B, C) == ["A", "B", "C"]
    assert fallback.decisions == {"fallback": 1}


def test_a_request_without_a_target_model_is_not_filtered() -> None:
    f = ServedModelFilter()
    assert kept(f, "", A, B, C) == ["A", "B", "C"]
    assert f.decisions == {"not_applicable": 1}
    assert f.candidates == 0  # nothing evaluated


def test_metrics_count_decisions_and_candidates() -> None:
    f = ServedModelFilter("served")
    kept(f, BASE, A, B, C)
    kept(f, "nowhere", A, B)
    samples = {(s.name, dict(s.labels).get("outcome", "")): s.value for s in f.metric_samples()}
    assert samples == {
        ("llm_d_epp_served_model_filter_decisions", "listed"): 1.0,
        ("llm_d_epp_served_model_filter_decisions", "unlisted"): 1.0,
        ("llm_d_epp_served_model_filter_candidates", ""): 5.0,
        ("llm_d_epp_served_model_filter_unlisted_candidates", ""): 2.0,
    }
    assert all(dict(s.labels)["plugin_name"] == "served" and not s.plugin_labels for s in f.metric_samples())


README_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: models-data-source
    parameters:
      interval: 5s
  - type: models-data-extractor
  - type: served-model-filter
  - type: queue-scorer
  - type: max-score-picker
dataLayer:
  sources:
    - pluginRef: models-data-source
      extractors:
        - pluginRef: models-data-extractor
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: served-model-filter
      - pluginRef: queue-scorer
      - pluginRef: max-score-picker
"""


def test_upstreams_example_config_loads() -> None:
    config = load_config_text(README_CONFIG, seed=0)
    assert isinstance(config.plugins["served-model-filter"], ServedModelFilter)
    polled = [p for p in config.data_layer.polled if p.source.typed_name.type == "models-data-source"]
    assert [e.typed_name.type for e in polled[0].extractors] == ["models-data-extractor"]


def test_a_config_without_the_models_extractor_is_refused() -> None:
    text = README_CONFIG.replace("  - type: models-data-extractor\n", "").replace(
        "      extractors:\n        - pluginRef: models-data-extractor\n", ""
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert any(
        "reads the /v1/models lists of a 'models-data-extractor'" in i.message for i in info.value.issues
    )


def test_on_missing_is_pass_or_fail() -> None:
    text = textwrap.dedent(
        """\
        apiVersion: inference.networking.x-k8s.io/v1alpha1
        kind: EndpointPickerConfig
        plugins:
          - type: models-data-extractor
          - type: served-model-filter
            parameters: {onMissing: pass}
        """
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    issue = next(i for i in info.value.issues if "onMissing" in i.message)
    assert issue.path.endswith("parameters.onMissing") and 'got "pass"' in issue.message
