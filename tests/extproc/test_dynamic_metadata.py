"""What response hooks report (request-attribute-reporter) reaches Envoy as dynamic metadata on the last
response answer, as in upstream's integration tests (request_attribute_reporter_test.go and llm-d's
request_attribute_reporter_streaming_test.go): usage {completion 10, prompt 32, total 42} reports
`envoy.lb/x-gateway-inference-request-cost = 10`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epick.config import load_config_text
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.extproc.exchange import BUFFERED, FULL_DUPLEX_STREAMED, STREAMED, Exchange
from epick.framework import Metrics
from epick.plugins import in_tree_registry
from epick.requestcontrol.director import DESTINATION_HEADER, Director
from tests.extproc.test_exchange import body, config, headers, kinds, response_body, streamed_body

KEY = "x-gateway-inference-request-cost"
USAGE = {"completion_tokens": 10, "prompt_tokens": 32, "total_tokens": 42}
REQUEST = json.dumps({"model": "m", "prompt": "test6", "max_tokens": 10}).encode()

# GIE v1.5.0 test/integration/epp/testdata/request-attribute-reporter-config.yaml, less its feature gate.
CONFIG = f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: openai-parser
  - name: total-tokens-cost-reporter
    type: request-attribute-reporter
    parameters:
      attributes:
        - key: {{namespace: envoy.lb, name: {KEY}}}
          expression: |
            usage.completion_tokens
          condition: "{{condition}}"
parser:
  pluginRef: openai-parser
"""


def director(condition: str = "has(usage.completion_tokens)") -> Director:
    registry = in_tree_registry()
    loaded = load_config_text(CONFIG.replace("{condition}", condition), registry=registry, seed=1)
    ds = Datastore()
    ds.upsert(EndpointSpec("ep0", "10.0.0.1", 8000, {}))
    ds.update_metrics("ep0", Metrics())
    return Director(loaded, ds.snapshot)


def response_headers(content_type: str) -> pb.ProcessingRequest:
    values = {":status": "200", "content-type": content_type}
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
            )
        )
    )


def reported(answer: pb.ProcessingResponse) -> Any:
    """The request cost in `answer`'s dynamic metadata, or None when it has none."""
    if not answer.HasField("dynamic_metadata"):
        return None
    return answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields[KEY].number_value


def routed(request_mode: int, response_mode: int, d: Director | None = None) -> Exchange:
    ex = Exchange(d or director())
    ex.handle(headers(config(request_mode, response_mode)))
    answers = ex.handle(body(REQUEST, eos=True))
    assert answers[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION_HEADER]
    assert KEY not in answers[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields
    return ex


def completion(**extra: Any) -> bytes:
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [], **extra}).encode()


def test_a_json_response_reports_the_cost_on_the_response_body_answer() -> None:
    ex = routed(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED)
    [head] = ex.handle(response_headers("application/json"))
    assert reported(head) is None
    payload = completion(usage=USAGE)
    answers = ex.handle(response_body(payload, eos=True))
    assert kinds(answers) == ["response_body"]
    assert streamed_body(answers, "response_body") == (payload, [True])
    assert reported(answers[-1]) == 10
    assert dict(answers[-1].dynamic_metadata.fields["envoy.lb"].struct_value.fields) == {
        KEY: answers[-1].dynamic_metadata.fields["envoy.lb"].struct_value.fields[KEY]
    }


def test_an_event_stream_reports_the_cost_on_its_last_answer_only() -> None:
    ex = routed(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED)
    ex.handle(response_headers("text/event-stream"))
    chunks = [
        b"data: " + completion(choices=[{"index": 0, "text": "hi"}]) + b"\n\n",
        b"data: " + completion(usage=USAGE) + b"\n\n",
        b"data: [DONE]\n\n",
    ]
    first = ex.handle(response_body(chunks[0], eos=False))
    second = ex.handle(response_body(chunks[1], eos=False))
    last = ex.handle(response_body(chunks[2], eos=True))
    assert [reported(a) for a in (*first, *second)] == [None, None]
    assert streamed_body(last, "response_body") == (chunks[2], [True])
    assert reported(last[-1]) == 10


def test_a_large_body_carries_the_metadata_on_its_last_chunk() -> None:
    ex = routed(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED)
    ex.handle(response_headers("application/json"))
    payload = completion(usage=USAGE, padding="x" * 150_000)
    answers = ex.handle(response_body(payload, eos=True))
    assert len(answers) > 1
    assert [reported(a) for a in answers] == [None] * (len(answers) - 1) + [10]


@pytest.mark.parametrize("mode", [BUFFERED, STREAMED])
def test_an_acknowledged_body_carries_the_metadata(mode: int) -> None:
    ex = routed(BUFFERED, mode)
    ex.handle(response_headers("application/json"))
    answers = ex.handle(response_body(completion(usage=USAGE), eos=True))
    assert kinds(answers) == ["response_body"] and not answers[0].response_body.HasField("response")
    assert reported(answers[0]) == 10


def test_trailers_that_end_the_response_carry_the_metadata() -> None:
    ex = routed(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED)
    ex.handle(response_headers("application/json"))
    body_answers = ex.handle(response_body(completion(usage=USAGE), eos=False))
    assert [reported(a) for a in body_answers] == [None]
    [trailers] = ex.handle(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    assert trailers.WhichOneof("response") == "response_trailers"
    assert reported(trailers) == 10


def test_nothing_reported_means_no_metadata() -> None:
    ex = routed(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED, director("usage.completion_tokens > 10"))
    ex.handle(response_headers("application/json"))
    answers = ex.handle(response_body(completion(usage=USAGE), eos=True))
    assert [a.HasField("dynamic_metadata") for a in answers] == [False]


def test_a_response_without_usage_reports_nothing() -> None:
    ex = routed(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED)
    ex.handle(response_headers("application/json"))
    answers = ex.handle(response_body(completion(), eos=True))
    assert [reported(a) for a in answers] == [None]
