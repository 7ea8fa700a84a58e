"""Kubernetes label selectors in both forms (epick.framework.labels): the structured form read, the
string form rendered and parsed back to a selector that matches the same labels."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epick.framework.labels import SelectorError, from_structured, parse_label_selector

KEYS = st.sampled_from(["app", "tier", "example.com/role", "zone"])
VALUES = st.sampled_from(["a", "b", "c-1", "x.y"])
EXPRESSIONS = st.one_of(
    st.builds(
        lambda k, op, vs: {"key": k, "operator": op, "values": sorted(set(vs))},
        KEYS,
        st.sampled_from(["In", "NotIn"]),
        st.lists(VALUES, min_size=1, max_size=3),
    ),
    st.builds(lambda k, op: {"key": k, "operator": op}, KEYS, st.sampled_from(["Exists", "DoesNotExist"])),
)


@given(
    st.dictionaries(KEYS, VALUES, max_size=2),
    st.lists(EXPRESSIONS, max_size=3),
    st.dictionaries(KEYS, VALUES, max_size=4),
)
def test_the_string_form_parses_back_to_a_selector_that_matches_alike(
    match_labels: dict[str, str], expressions: list[dict[str, object]], labels: dict[str, str]
) -> None:
    selector = from_structured(match_labels, expressions)
    again = parse_label_selector(selector.render())
    assert again.matches(labels) == selector.matches(labels)


def test_the_structured_form_means_what_kubernetes_says() -> None:
    selector = from_structured(
        {"app": "vllm"},
        [
            {"key": "tier", "operator": "In", "values": ["gpu", "tpu"]},
            {"key": "canary", "operator": "DoesNotExist"},
        ],
    )
    assert selector.render() == "app=vllm,tier in (gpu,tpu),!canary"
    assert selector.matches({"app": "vllm", "tier": "gpu"})
    assert not selector.matches({"app": "vllm", "tier": "gpu", "canary": "1"})
    assert not selector.matches({"app": "vllm", "tier": "cpu"})
    assert from_structured({}).render() == "" and from_structured({}).matches({"any": "thing"})


@pytest.mark.parametrize(
    ("match_labels", "expressions", "complaint"),
    [
        ({"app": 3}, [], "matchLabels must map label names to strings"),
        ({}, [{"operator": "In", "values": ["a"]}], "needs a key"),
        ({}, [{"key": "k", "operator": "Near"}], "unknown operator 'Near'"),
        ({}, [{"key": "k", "operator": "In", "values": []}], "'k' In needs values"),
    ],
)
def test_a_malformed_structured_selector_is_refused_naming_what_is_wrong(
    match_labels: dict[str, object], expressions: list[object], complaint: str
) -> None:
    with pytest.raises(SelectorError, match=complaint):
        from_structured(match_labels, expressions)
