"""`request-attribute-reporter`: the parameters upstream accepts and refuses, and what its CEL
expression reports for a response (cases from upstream's plugin_test.go and integration tests)."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import Response, Usage
from epick.plugins import in_tree_registry
from epick.plugins.registry import ParameterError, Registry
from epick.plugins.reporters.request_attribute import (
    DEFAULT_NAMESPACE,
    RequestAttributeReporter,
    usage_variable,
)
from tests.builders import make_endpoint, make_request

KEY = "x-gateway-inference-request-cost"
TOTAL = (
    "(has(usage.prompt_tokens)?usage.prompt_tokens:0)"
    "+(has(usage.completion_tokens)?usage.completion_tokens:0)"
)
UPSTREAM = Path(__file__).parents[1] / "config" / "upstream"


def registry() -> Registry:
    reg = in_tree_registry()
    return reg


def reporter(
    expression: str, condition: str = "", namespace: str = DEFAULT_NAMESPACE
) -> RequestAttributeReporter:
    return RequestAttributeReporter(
        key_name=KEY, expression=expression, condition=condition, namespace=namespace
    )


def report(
    plugin: RequestAttributeReporter, usage: Usage | None, response: Response | None = None
) -> dict[str, dict[str, float | str | bool]]:
    response = response or Response("r1")
    response.usage = usage
    response.end_of_stream = True
    plugin.response_complete(make_request(request_id="r1"), response, make_endpoint())
    return response.dynamic_metadata


# What is reported.


def test_the_guarded_sum_of_prompt_and_completion_tokens_is_42() -> None:
    assert report(reporter(TOTAL), Usage(prompt_tokens=32, completion_tokens=10)) == {"envoy.lb": {KEY: 42.0}}


def test_gie_integration_config_reports_the_completion_tokens_10() -> None:
    plugin = reporter("usage.completion_tokens\n", condition="has(usage.completion_tokens)")
    assert report(plugin, Usage(prompt_tokens=32, completion_tokens=10)) == {"envoy.lb": {KEY: 10.0}}


def test_a_false_condition_writes_nothing() -> None:
    plugin = reporter("usage.prompt_tokens", condition="usage.completion_tokens > 0")
    assert report(plugin, Usage(prompt_tokens=10, completion_tokens=0)) == {}


def test_a_condition_that_is_not_a_bool_writes_nothing() -> None:
    assert report(reporter("usage.prompt_tokens", condition="usage.prompt_tokens"), Usage(10)) == {}


def test_an_expression_that_is_not_a_number_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert report(reporter("'not a number'"), Usage(10)) == {}
    assert "not a double or an int" in caplog.text


@pytest.mark.parametrize(
    "expression",
    [
        "usage.prompt_tokens",  # zero: skipped
        "usage.prompt_tokens - 1.0",  # -1: upstream's "not a number" sentinel
        "5u",  # a uint is neither a double nor an int
        "true",
        "usage.non_existent_field",  # an evaluation error (no has() guard)
        "usage.prompt_tokens_details.cached_tokens",  # absent when no cached tokens were reported
        "usage.completion_tokens + 1",  # a double and an int: cel-go has no such overload
        "usage.completion_tokens % 2.0",  # no remainder of doubles
        "1.0 / 0.0",  # not finite
        "1e30",  # beyond a 64-bit integer
    ],
)
def test_nothing_is_written_for(expression: str) -> None:
    assert report(reporter(expression), Usage(prompt_tokens=0, completion_tokens=7)) == {}


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("usage.total_tokens", 42.0),  # prompt plus completion
        ("usage.prompt_tokens / 5.0", 6.0),  # 6.4, truncated
        ("-usage.prompt_tokens / 5.0", -6.0),  # toward zero
        ("usage.prompt_tokens + 1.0", 33.0),
        ("int(usage.prompt_tokens) * 2", 64.0),  # an int result
        ("usage.completion_tokens == 10 ? 1 : 2", 1.0),  # numbers compare across types
        ("0 == 0.0 && 1 < 1.5 ? 3 : 4", 3.0),
        ("'a' == 1 ? 3 : 4", 4.0),  # values of two types are unequal, not an error
        ("[1.0, 2.0].map(x, x * 2.0)[1]", 4.0),  # a macro's variable
        ("size(usage)", 3.0),  # prompt_tokens, completion_tokens, total_tokens
        ("has(usage.prompt_tokens_details) ? 1 : 2", 2.0),
    ],
)
def test_values(expression: str, value: float) -> None:
    assert report(reporter(expression), Usage(prompt_tokens=32, completion_tokens=10)) == {
        "envoy.lb": {KEY: value}
    }


def test_has_is_true_for_a_zero_count_and_the_guarded_sum_of_an_empty_usage_writes_nothing() -> None:
    assert report(reporter("has(usage.completion_tokens) ? 5 : 6"), Usage()) == {"envoy.lb": {KEY: 5.0}}
    assert report(reporter(TOTAL), Usage()) == {}
    assert report(reporter(TOTAL), None) == {}  # no usage read: all zero, as upstream's empty Usage
    assert report(reporter(TOTAL), Usage(completion_tokens=25)) == {"envoy.lb": {KEY: 25.0}}


def test_cached_tokens_are_there_when_reported() -> None:
    usage = Usage(prompt_tokens=32, completion_tokens=10, cached_tokens=16)
    assert usage_variable(Response("r", usage=usage)) == {
        "prompt_tokens": 32.0,
        "completion_tokens": 10.0,
        "total_tokens": 42.0,
        "prompt_tokens_details": {"cached_tokens": 16.0},
    }
    plugin = reporter("usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens")
    assert report(plugin, usage) == {"envoy.lb": {KEY: 16.0}}


def test_other_metadata_is_kept_and_the_namespace_is_merged() -> None:
    response = Response("r1", dynamic_metadata={"pre-existing": {"a": "data"}, "custom": {"b": 1.0}})
    metadata = report(reporter("usage.prompt_tokens", namespace="custom"), Usage(15), response)
    assert metadata == {"pre-existing": {"a": "data"}, "custom": {"b": 1.0, KEY: 15.0}}


def test_a_failed_response_reports_nothing() -> None:
    response = Response("r1", error="client disconnected")
    assert report(reporter("usage.prompt_tokens"), Usage(15), response) == {}


def test_evaluation_problems_warn_once_then_quietly(caplog: pytest.LogCaptureFixture) -> None:
    plugin = reporter("usage.nope")
    with caplog.at_level(logging.DEBUG, logger="epick.plugins.reporters.request_attribute"):
        for _ in range(3):
            report(plugin, Usage(1))
    levels = [r.levelno for r in caplog.records if "usage.nope" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_building_leaves_the_recursion_limit_alone() -> None:
    before = sys.getrecursionlimit()
    reporter(TOTAL)
    assert sys.getrecursionlimit() == before


# Parameters.


def _config(parameters: str | None) -> str:
    text = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: cost
  type: request-attribute-reporter
"""
    if parameters is not None:
        text += "  parameters:\n" + "".join(f"    {line}\n" for line in parameters.splitlines())
    return text


def test_a_config_builds_the_plugin_with_its_defaults() -> None:
    config = load_config_text(
        _config(f"attributes:\n- key: {{name: {KEY}}}\n  expression: usage.completion_tokens"),
        registry=registry(),
    )
    plugin = config.plugins["cost"]
    assert isinstance(plugin, RequestAttributeReporter)
    assert str(plugin.typed_name) == "cost/request-attribute-reporter"
    assert (plugin.namespace, plugin.key_name, plugin.condition) == ("envoy.lb", KEY, "")
    assert config.hooks.response_complete == [plugin]


def test_an_empty_namespace_means_envoy_lb() -> None:
    config = load_config_text(
        _config(f"attributes:\n- key: {{namespace: '', name: {KEY}}}\n  expression: '1'"),
        registry=registry(),
    )
    plugin = config.plugins["cost"]
    assert isinstance(plugin, RequestAttributeReporter) and plugin.namespace == "envoy.lb"


def test_the_gie_integration_config_loads() -> None:
    path = UPSTREAM / "gie-v1.5.0" / "integration-request-attribute-reporter-config.yaml"
    config = load_config_text(path.read_text(), registry=registry())
    plugin = config.plugins["total-tokens-cost-reporter"]
    assert config.hooks.response_complete == [plugin]
    assert isinstance(plugin, RequestAttributeReporter)
    assert report(plugin, Usage(prompt_tokens=32, completion_tokens=10)) == {"envoy.lb": {KEY: 10.0}}


ONE = f"- key: {{name: {KEY}}}\n  expression: usage.prompt_tokens"


@pytest.mark.parametrize(
    ("parameters", "path", "message"),
    [
        (None, "attributes", "attributes must contain exactly one entry (found 0)"),
        ("attributes: []", "attributes", "attributes must contain exactly one entry (found 0)"),
        (f"attributes:\n{ONE}\n{ONE}", "attributes", "attributes must contain exactly one entry (found 2)"),
        ("attributes:\n- key: {name: ''}\n  expression: '1'", "attributes[0].key.name",
         "attributeKey.name cannot be empty"),
        ("attributes:\n- expression: '1'", "attributes[0].key.name", "attributeKey.name cannot be empty"),
        ("attributes:\n- key: {name: k}", "attributes[0].expression",
         "attributes[0].expression cannot be empty"),
        ("attributes:\n- key: {name: k}\n  expression: 'usage.prompt_tokens + -'",
         "attributes[0].expression", "failed to compile expression: syntax error at line 1, column 23"),
        ("attributes:\n- key: {name: k}\n  expression: 'usage.prompt_tokens'\n"
         "  condition: 'usage.prompt_tokens > '",
         "attributes[0].condition", "failed to compile condition: syntax error"),
        ("attributes:\n- key: {name: k}\n  expression: 'request.size + 1'", "attributes[0].expression",
         "failed to compile expression: undeclared reference to 'request'"),
        ("attributes:\n- key: {name: k}\n  expression: 'lowerAscii(\"A\")'", "attributes[0].expression",
         "failed to compile expression: undeclared reference to 'lowerAscii'"),
        ("attributes:\n- key: {name: k}\n  expression: '1'\n  condition: 'x > 1'", "attributes[0].condition",
         "failed to compile condition: undeclared reference to 'x'"),
    ],
)  # fmt: skip
def test_bad_parameters_are_config_errors(parameters: str | None, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(_config(parameters), registry=registry())
    [issue] = caught.value.issues
    assert issue.path == f"plugins[0].parameters.{path}"
    assert issue.message.startswith(f"request-attribute-reporter: {message}"), issue.message


def test_unknown_parameters_are_refused() -> None:
    text = _config(f"attributes:\n{ONE}\n  weight: 2")
    with pytest.raises(ConfigError, match=re.escape("plugins[0].parameters.attributes[0].weight")):
        load_config_text(text, registry=registry())


def test_the_constructor_refuses_what_upstream_new_refuses() -> None:
    with pytest.raises(ParameterError, match=re.escape("attributeKey.name cannot be empty")):
        RequestAttributeReporter(key_name="", expression="1")
    with pytest.raises(ParameterError, match="failed to compile expression"):
        RequestAttributeReporter(key_name="k", expression="(")


def test_an_expression_too_deep_for_the_evaluator_is_refused_at_load() -> None:
    with pytest.raises(ParameterError, match="nested too deeply"):
        RequestAttributeReporter(key_name="k", expression="(" * 40 + "usage.prompt_tokens" + ")" * 40)
    nested = "usage.prompt_tokens"
    for i in range(8):
        nested = f"(usage.completion_tokens > {i}.0 ? {nested} : 1.0)"
    assert report(reporter(nested), Usage(prompt_tokens=32, completion_tokens=10)) == {
        "envoy.lb": {KEY: 32.0}
    }
