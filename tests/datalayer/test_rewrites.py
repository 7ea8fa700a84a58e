"""InferenceModelRewrite resources: parsed as the CRD validates them, applied with GIE's precedence."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
import yaml

from epick.datalayer.rewrites import ModelRewrites, RewriteError, for_pool, parse_rewrite, parse_rewrites


def resource(
    name: str, rules: list[dict[str, Any]], created: str = "", pool: str = "pool", **extra: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if created:
        meta["creationTimestamp"] = created
    return {
        "apiVersion": extra.get("api", "llm-d.ai/v1alpha2"),
        "kind": "InferenceModelRewrite",
        "metadata": meta,
        "spec": {"poolRef": {"name": pool}, "rules": rules},
    }


def rule(models: list[str], *targets: str) -> dict[str, Any]:
    return {"matches": [{"model": {"type": "Exact", "value": m}} for m in models],
            "targets": [{"modelRewrite": t} for t in targets]}  # fmt: skip


def test_exact_matches_win_over_generic_rules_then_the_oldest_resource_then_rule_order() -> None:
    older = resource(
        "older", [rule([], "catch-all-old"), rule(["a"], "a-old")], created="2026-01-01T00:00:00Z"
    )
    newer = resource(
        "newer", [rule(["a", "b"], "ab-new"), rule(["b"], "b-second")], created="2026-06-01T00:00:00Z"
    )
    rewrites = ModelRewrites((parse_rewrite(newer), parse_rewrite(older)))
    assert rewrites.target_model("a") == "a-old"  # exact in both: the older resource
    assert rewrites.target_model("b") == "ab-new"  # exact only in newer: its first matching rule
    assert rewrites.target_model("c") == "catch-all-old"  # no exact match: the generic rule
    assert ModelRewrites().target_model("a") is None


def test_targets_without_weights_share_equally() -> None:
    rewrites = ModelRewrites((parse_rewrite(resource("r", [rule(["m"], "x", "y")])),), random.Random(2))
    picks = [rewrites.target_model("m") for _ in range(1000)]
    assert 0.45 < picks.count("x") / 1000 < 0.55


def spec(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"poolRef": {"name": "p"}, "rules": list(rules)}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "InferencePool"}, "kind must be InferenceModelRewrite"),
        ({"apiVersion": "v1"}, "apiVersion must be one of"),
        ({"metadata": {}}, "metadata.name is required"),
        ({"spec": {"rules": [rule(["m"], "x")]}}, "'r': spec.poolRef.name is required"),
        ({"spec": {"poolRef": {"name": "p"}, "rules": []}}, "spec.rules must be a non-empty list"),
        ({"spec": {"poolRef": {"name": "p"}, "rules": [{"matches": []}]}}, "spec.rules[0].targets must be"),
        (spec({"targets": [{"modelRewrite": "x", "weight": 1}, {"modelRewrite": "y"}]}),
         "give a weight to every target or to none"),
        (spec({"targets": [{"modelRewrite": "x", "weight": 0}]}),
         "targets[0].weight must be an integer from 1 to 1000000"),
        (spec({"matches": [{"model": {"type": "Prefix", "value": "l"}}], "targets": [{"modelRewrite": "x"}]}),
         "matches[0].model.type must be Exact"),
    ],
)  # fmt: skip
def test_bad_resources_are_named_with_the_field_at_fault(change: dict[str, Any], message: str) -> None:
    raw = {**resource("r", [rule(["m"], "x")]), **change}
    with pytest.raises(RewriteError, match=re.escape(message)):
        parse_rewrite(raw, "rewrites.yaml document 0")


def test_a_file_of_documents_and_lists_filtered_by_pool() -> None:
    text = yaml.safe_dump_all(
        [
            resource("a", [rule(["m"], "x")], api="inference.networking.x-k8s.io/v1alpha2"),
            {"kind": "InferenceModelRewriteList", "items": [resource("b", [rule(["n"], "y")], pool="other")]},
            None,
        ]
    )
    found = parse_rewrites(yaml.safe_load_all(text), "rewrites.yaml")
    assert [r.name for r in found] == ["a", "b"]
    assert [r.name for r in for_pool(found, "pool")] == ["a"]
    assert len(for_pool(found, None)) == 2
    with pytest.raises(RewriteError, match=r"rewrites\.yaml: InferenceModelRewrite names given twice: a"):
        parse_rewrites([resource("a", [rule(["m"], "x")])] * 2, "rewrites.yaml")
    with pytest.raises(RewriteError, match=r"rewrites.yaml: document 0 items\[0\]: kind must be"):
        parse_rewrites([{"kind": "InferenceModelRewriteList", "items": [{"kind": "Pod"}]}], "rewrites.yaml")
