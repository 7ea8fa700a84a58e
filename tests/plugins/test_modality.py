"""modality-filter: the request's path names the model architectures that can answer it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from epick.config import load_config_text
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.framework import CycleState, Endpoint
from epick.plugins.filters.modality import MODEL_ARCH_LABEL, ModalityFilter
from epick.requestcontrol.director import Director
from tests.builders import make_endpoint, make_request

TTS = make_endpoint("tts", labels={MODEL_ARCH_LABEL: "autoregressive-tts"})
OMNI = make_endpoint("omni", labels={MODEL_ARCH_LABEL: "omni-llm"})
STT = make_endpoint("stt", labels={MODEL_ARCH_LABEL: "encoder-decoder-stt"})
DIFFUSION = make_endpoint("diffusion", labels={MODEL_ARCH_LABEL: "diffusion"})
LLM = make_endpoint("llm", labels={MODEL_ARCH_LABEL: "autoregressive-llm"})
PLAIN = make_endpoint("plain")  # no architecture label
ALL = [TTS, OMNI, STT, DIFFUSION, LLM, PLAIN]


def kept(path: str, endpoints: list[Endpoint] = ALL) -> list[str]:
    request = replace(make_request(), headers={":path": path})
    return [ep.name for ep in ModalityFilter().filter(request, CycleState(), endpoints)]


@pytest.mark.parametrize(
    ("path", "names"),
    [
        ("/v1/audio/speech", ["tts", "omni"]),
        ("/v1/audio/transcriptions?lang=en", ["stt"]),  # the query is not part of the path
        ("/v1/images/generations", ["diffusion"]),
        ("/v1/chat/completions", ["tts", "omni", "stt", "diffusion", "llm", "plain"]),  # not a modality path
        ("", ["tts", "omni", "stt", "diffusion", "llm", "plain"]),
    ],
)
def test_the_path_names_the_architectures_that_pass(path: str, names: list[str]) -> None:
    assert kept(path) == names


def test_no_endpoint_of_the_architecture_leaves_none() -> None:
    assert kept("/v1/images/generations", [LLM, PLAIN]) == []


def test_the_proxys_requests_carry_their_path_for_it() -> None:
    """Envoy passes `:path` to ext_proc; the proxy's requests get it from the director."""
    ds = Datastore()
    ds.upsert(EndpointSpec("a", "10.0.0.1", 8000, {MODEL_ARCH_LABEL: "diffusion"}))
    ds.upsert(EndpointSpec("b", "10.0.0.2", 8000, {MODEL_ARCH_LABEL: "autoregressive-llm"}))
    config = load_config_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: modality-filter\n- type: max-score-picker\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: modality-filter\n"
        "  - pluginRef: max-score-picker\n",
        seed=0,
    )
    director = Director(config, ds.snapshot)
    body = json.dumps({"model": "m", "prompt": "a cat"}).encode()
    for _ in range(5):
        cycle = director.begin(body, {}, "/v1/images/generations")
        assert cycle.request.headers[":path"] == "/v1/images/generations"
        assert [ep.name for ep in cycle.decide().targets] == ["a"]
