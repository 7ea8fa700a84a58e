"""`probabilistic-admitter`: hand-checked against upstream's formula (llm-d-router's plugin.go and its
README): saturation = mean of max(queue / 5, kv / 0.8), probability = min(1, saturation^5 × 300)."""

from __future__ import annotations

import random
import textwrap

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState
from epick.plugins.admission.probabilistic import ProbabilisticAdmitter, ProbabilisticParameters
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def sheddable() -> object:
    request = make_request("p")
    object.__setattr__(request, "priority", -1)
    return request


def test_saturation_and_probability_as_upstream_computes_them() -> None:
    a = ProbabilisticAdmitter()
    # {QD 1, KV 0.16} -> max(0.2, 0.2) = 0.2; {QD 0, KV 0.08} -> max(0, 0.1) = 0.1; mean 0.15
    eps = [make_endpoint("a", queue=1, kv=0.16), make_endpoint("b", queue=0, kv=0.08)]
    assert a.saturation(eps) == pytest.approx(0.15)
    assert a.probability(0.15) == pytest.approx(0.15**5 * 300)  # 0.0227813
    assert a.probability(0.20) == pytest.approx(0.096)
    assert a.probability(0.30) == pytest.approx(0.729)
    assert a.probability(0.3195) < 1.0 <= a.probability(0.3196)  # full shedding from (1/300)^(1/5)
    # {QD 2, KV 0.4} -> 0.5; {QD 0, KV 0.2} -> 0.25; mean 0.375 -> always refused
    busy = [make_endpoint("a", queue=2, kv=0.4), make_endpoint("b", queue=0, kv=0.2)]
    assert a.saturation(busy) == pytest.approx(0.375) and a.probability(0.375) == 1.0
    assert ProbabilisticAdmitter(params=ProbabilisticParameters(k=100)).probability(0.2) == pytest.approx(
        0.032
    )


def test_only_sheddable_requests_are_refused() -> None:
    a = ProbabilisticAdmitter(rng=random.Random(0))
    busy = [make_endpoint("a", queue=10, kv=0.9)]
    assert a.admit(make_request("p"), CycleState(), busy) is None  # priority 0: never
    reason = a.admit(sheddable(), CycleState(), busy)  # type: ignore[arg-type]
    assert reason == "probabilistic-admitter: rejected, saturation=2.000 prob=1.00"
    assert a.admit(sheddable(), CycleState(), [make_endpoint("a")]) is None  # idle: probability 0  # type: ignore[arg-type]
    assert a.admit(sheddable(), CycleState(), []) is None  # type: ignore[arg-type]


def test_refusal_rate_follows_the_probability() -> None:
    a = ProbabilisticAdmitter(rng=random.Random(7))
    eps = [make_endpoint("a", queue=1, kv=0.0)]  # saturation 0.2 -> probability 0.096
    refused = sum(a.admit(sheddable(), CycleState(), eps) is not None for _ in range(20000))  # type: ignore[arg-type]
    assert 0.085 < refused / 20000 < 0.107


def test_the_request_path_answers_429_naming_the_admitter() -> None:
    config = load_config_text(
        HEADER + "plugins:\n- type: probabilistic-admitter\n- type: queue-scorer\n", seed=1
    )
    path = RequestPath(config)
    busy = (make_endpoint("a", queue=4, kv=0.7),)  # not saturated for the detector; 0.875 here
    with pytest.raises(RequestError) as info:
        path.decide(sheddable(), busy)  # type: ignore[arg-type]
    assert info.value.status == 429
    assert "request cannot be admitted: probabilistic-admitter: rejected" in str(info.value)
    assert path.decide(make_request("p"), busy).targets[0].name == "a"


@pytest.mark.parametrize("field", ["queueDepthThreshold", "kvCacheUtilThreshold", "power", "k"])
def test_every_parameter_must_be_positive(field: str) -> None:
    text = HEADER + textwrap.dedent(
        f"""\
        plugins:
        - type: probabilistic-admitter
          parameters: {{{field}: 0}}
        """
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert info.value.issues[0].path == f"plugins[0].parameters.{field}"
