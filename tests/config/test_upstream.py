"""The upstream catalogue (epick.config.upstream) in the loader: missing types, feature gates, apiVersions,
did-you-mean suggestions that never name a plugin of the opposite meaning, and the docs table."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from epick.config import ConfigError, LoadedConfig, load_config_text
from epick.config.schema import API_VERSIONS
from epick.config.suggest import ANTONYMS, did_you_mean, is_opposite, words
from epick.config.upstream import (
    EQUIVALENT_FIXES,
    FEATURE_GATES,
    RETIRED_FEATURE_GATES,
    UPSTREAM_API_VERSIONS,
    UPSTREAM_TYPES,
    UpstreamType,
    missing_types,
    missing_types_table,
    upstream_type,
)
from epick.plugins import Registry, in_tree_plugins, in_tree_registry

ROOT = Path(__file__).resolve().parents[2]
HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
EPICK_TYPES = frozenset(in_tree_registry().types())
MISSING = missing_types(EPICK_TYPES)
# epick has every upstream type of ebab687; the report of a missing one is checked on a registry
# without the conformance plugins.
WITHHELD = frozenset({"header-based-testing-filter", "destination-endpoint-served-verifier"})


def _withheld_registry() -> Registry:
    registry = Registry()
    for spec in in_tree_plugins():
        if spec.type not in WITHHELD:
            registry.register(spec)
    return registry


LACKING = missing_types(EPICK_TYPES - WITHHELD)
PRESENT = tuple(t for t in UPSTREAM_TYPES if t.name in EPICK_TYPES)
DOC_HEADING = "## Upstream types epick does not have yet"


def load(body: str, **kwargs: Any) -> LoadedConfig:
    kwargs.setdefault("registry", in_tree_registry())
    return load_config_text(HEADER + textwrap.dedent(body), source="test.yaml", **kwargs)


def errors(body: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(body)
    return info.value


# --- the catalogue ---------------------------------------------------------------------------------


def test_catalogue_is_sorted_unique_and_self_consistent() -> None:
    names = [t.name for t in UPSTREAM_TYPES]
    assert names == sorted(names)
    assert len(names) == len(set(names))
    for t in UPSTREAM_TYPES:
        assert t.origin.startswith("llm-d/llm-d-router, pkg/epp/framework/plugins/"), t
        assert t.stability in ("alpha", "beta", "stable"), t
        assert t.kind, t
        # A deprecated type names a replacement that upstream registers, and only those do.
        assert bool(t.deprecated_in) == bool(t.replacement) == bool(t.removal_in), t
        if t.replacement:
            assert upstream_type(t.replacement) is not None, t
    assert set(EQUIVALENT_FIXES) <= {t.name for t in MISSING}


def test_catalogue_splits_into_types_epick_has_and_lacks() -> None:
    assert len(MISSING) + len(PRESENT) == len(UPSTREAM_TYPES)
    assert PRESENT and {t.name for t in LACKING} == WITHHELD | {t.name for t in MISSING}
    # Upstream types epick implements, among them ones it has under an alias.
    for name in ("max-score-picker", "decode-filter", "disagg-profile-handler", "disagg-headers-handler"):
        assert upstream_type(name) in PRESENT


def test_upstream_type_lookup() -> None:
    found = upstream_type("prefix-cache-affinity-filter")
    assert found == UpstreamType(
        "prefix-cache-affinity-filter",
        "filter",
        "pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity",
        "beta",
    )
    assert found.origin == (
        "llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity"
    )
    assert upstream_type("low-queue-filter") is None  # GIE's old type: epick has it, upstream no longer


# --- types upstream has and epick lacks ----------------------------------------------------------------


@pytest.mark.parametrize("upstream", LACKING, ids=lambda t: t.name)
def test_missing_upstream_type_is_reported_with_its_origin(upstream: UpstreamType) -> None:
    with pytest.raises(ConfigError) as info:
        load(f"plugins:\n- type: {upstream.name}\n", registry=_withheld_registry())
    err = info.value
    assert len(err.issues) == 1
    issue = err.issues[0]
    assert issue.path == "plugins[0].type"
    assert issue.message.startswith(
        f"plugin type {upstream.name!r} is an upstream EPP {upstream.kind} ({upstream.origin}"
    )
    assert issue.message.endswith(") that epick does not implement yet")
    if upstream.deprecated:
        assert f"replaced by {upstream.replacement!r}" in issue.message
    if upstream.name in EQUIVALENT_FIXES:
        assert issue.fix == EQUIVALENT_FIXES[upstream.name]
    elif upstream.replacement in EPICK_TYPES:
        assert issue.fix == f"use {upstream.replacement!r}, its upstream replacement, which epick has"
    else:
        assert issue.fix == "see docs/plugins.md for the upstream types epick has"
    assert "unknown plugin type" not in issue.message
    assert "did you mean" not in issue.fix


def test_missing_type_message_reads_as_documented() -> None:
    # Every upstream type but the test-only ones is in epick now: one is left out of the registry.
    registry = Registry()
    for spec in in_tree_plugins():
        if spec.type != "slo-headroom-tier-filter":
            registry.register(spec)
    with pytest.raises(ConfigError) as info:
        load("plugins:\n- type: slo-headroom-tier-filter\n", registry=registry)
    err = info.value
    assert str(err) == (
        "test.yaml: plugins[0].type: plugin type 'slo-headroom-tier-filter' is an upstream EPP filter "
        "(llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/sloheadroomtier) that epick "
        "does not implement yet (fix: see docs/plugins.md for the upstream types epick has)"
    )


def test_test_only_types_say_so_where_missing() -> None:
    with pytest.raises(ConfigError) as info:
        load("plugins:\n- type: header-based-testing-filter\n", registry=_withheld_registry())
    [testing] = info.value.issues
    assert "conformance tests only" in testing.message


def test_a_deprecated_name_epick_implements_loads_with_a_warning() -> None:
    config = load("plugins:\n- type: tokenizer\n")
    assert any(
        "'tokenizer' is deprecated upstream since v0.9.0" in w and "'token-producer'" in w
        for w in config.warnings
    )


@pytest.mark.parametrize("upstream", PRESENT, ids=lambda t: t.name)
def test_upstream_type_epick_has_is_not_reported_missing(upstream: UpstreamType) -> None:
    try:
        load(f"plugins:\n- type: {upstream.name}\n")
    except ConfigError as e:  # some need parameters or other plugins; none may be reported unknown
        for issue in e.issues:
            assert "does not implement yet" not in issue.message, issue
            assert "unknown plugin type" not in issue.message, issue


# --- did-you-mean never suggests the opposite ---------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), ANTONYMS)
def test_every_antonym_pair_is_opposite_both_ways(a: str, b: str) -> None:
    assert is_opposite(f"{a}-filter", f"{b}-filter")
    assert is_opposite(f"{b}-filter", f"{a}-filter")
    assert not is_opposite(f"{a}-filter", f"{a}-filtre")


@pytest.mark.parametrize(
    ("given", "candidate", "opposite"),
    [
        ("encode-filter", "decode-filter", True),
        ("encode-filtre", "decode-filter", True),  # a typo elsewhere does not hide the swap
        ("encod-filter", "decode-filter", True),  # nor does a typo in the antonym itself
        ("prefil-filter", "decode-filter", True),
        ("prefillProfile", "decodeProfile", True),  # camelCase words
        ("min_score", "max_score", True),
        ("lowQueue", "high-queue", True),
        ("include-list", "exclude-list", True),
        ("allow", "deny", True),
        ("least-queue", "most-queue", True),
        ("decode-filtre", "decode-filter", False),
        ("decod-filter", "decode-filter", False),
        ("low-queue", "least-queue", False),
        ("prefill-decode", "decode", False),  # the candidate's word is in the given name too
        ("queue-scorer", "queue-scorer", False),
    ],
)
def test_is_opposite(given: str, candidate: str, opposite: bool) -> None:
    assert is_opposite(given, candidate) is opposite


def test_words_split_at_separators_and_camel_case() -> None:
    assert words("prefill-header_handler.v2") == ["prefill", "header", "handler", "v", "2"]
    assert words("maxNumOfEndpoints") == ["max", "num", "of", "endpoints"]
    assert words("HTTPServer") == ["http", "server"]


def test_did_you_mean_skips_the_opposite_but_keeps_real_typos() -> None:
    types = sorted(EPICK_TYPES)
    assert did_you_mean("decode-filtre", types) == "decode-filter"
    assert did_you_mean("prefil-filter", types) == "prefill-filter"
    assert did_you_mean("encode-filtre", types) != "decode-filter"
    assert did_you_mean("min-score-picker", types) != "max-score-picker"
    assert did_you_mean("queue-scorrer", types) == "queue-scorer"
    assert did_you_mean("anything", []) is None


def test_loader_never_suggests_the_opposite_type() -> None:
    # A typo of encode-filter suggests encode-filter, never decode-filter (one letter closer).
    err = errors("plugins:\n- type: encode-filtre\n")
    (issue,) = err.issues
    assert issue.message == "unknown plugin type 'encode-filtre'"
    assert "decode-filter" not in issue.fix
    assert issue.fix.startswith("did you mean 'encode-filter'?")
    err = errors("plugins:\n- type: min-score-picker\n")
    assert "max-score-picker" not in str(err)


def test_loader_still_suggests_a_real_typo() -> None:
    err = errors("plugins:\n- type: decode-filtre\n")
    (issue,) = err.issues
    assert issue.message == "unknown plugin type 'decode-filtre'"
    assert issue.fix.startswith("did you mean 'decode-filter'?")


def test_plugin_references_never_suggest_the_opposite() -> None:
    body = """\
        plugins:
        - {type: decode-filter, name: decode}
        - {type: decision-tree-filter, name: t1, parameters: {current: {pluginRef: encode}}}
        - {type: decision-tree-filter, name: t2, parameters: {current: {pluginRef: decod}}}
        schedulingProfiles:
        - name: p
          plugins: [{pluginRef: encode}, {pluginRef: decde}]
        """
    err = errors(body)
    by_path = {i.path: i for i in err.issues}
    assert "'decode'" not in by_path["plugins[1].parameters.current.pluginRef"].fix
    assert by_path["plugins[2].parameters.current.pluginRef"].fix == "did you mean 'decode'?"
    assert "'decode'" not in by_path["schedulingProfiles[0].plugins[0].pluginRef"].fix
    assert by_path["schedulingProfiles[0].plugins[1].pluginRef"].fix == "did you mean 'decode'?"


def test_parameter_names_never_suggest_the_opposite() -> None:
    err = errors("plugins:\n- type: max-score-picker\n  parameters: {minNumOfEndpoints: 2}\n")
    (issue,) = err.issues
    assert issue.path == "plugins[0].parameters.minNumOfEndpoints"
    assert not issue.fix.startswith("did you mean")
    err = errors("plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoint: 2}\n")
    assert err.issues[0].fix.startswith("did you mean 'maxNumOfEndpoints'?")


# --- apiVersion ----------------------------------------------------------------------------------------


def test_llm_d_v1_loads() -> None:
    config = load_config_text(
        "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
    )
    assert list(config.scheduler.profiles) == ["default"]


def test_every_version_upstream_decodes_is_accepted() -> None:
    assert set(UPSTREAM_API_VERSIONS) <= set(API_VERSIONS)
    assert "llm-d.ai/v1" in API_VERSIONS


# --- feature gates -------------------------------------------------------------------------------------


def test_unknown_feature_gate_fails_at_its_path_naming_the_known_gates() -> None:
    err = errors("featureGates: [flowControl, noSuchGate]\n")
    (issue,) = err.issues
    assert issue.path == "featureGates[1]"
    assert issue.message == "unknown feature gate 'noSuchGate'"
    assert "known gates: flowControl, haPopulateNonLeaderDatastore" in issue.fix


def test_misspelt_feature_gate_suggests_the_gate() -> None:
    (issue,) = errors("featureGates: [flowcontrol]\n").issues
    assert issue.path == "featureGates[0]"
    assert issue.fix.startswith("did you mean 'flowControl'?")


@pytest.mark.parametrize("retired", RETIRED_FEATURE_GATES, ids=lambda g: g.name)
def test_retired_feature_gate_loads_with_a_warning_that_it_has_no_effect(retired: Any) -> None:
    # GIE v1.5.0's integration configs carry enableLegacyMetrics, llm-d v0.8.0's prepareDataPlugins.
    loaded = load(f"featureGates: [{retired.name}]\n")
    (warning,) = [w for w in loaded.warnings if retired.name in w]
    assert f"feature gate {retired.name!r} has no effect" in warning
    assert retired.removed_in in warning


def test_misspelt_retired_feature_gate_is_unknown_and_suggests_it() -> None:
    (issue,) = errors("featureGates: [enableLegacyMetric]\n").issues
    assert issue.message == "unknown feature gate 'enableLegacyMetric'"
    assert issue.fix.startswith("did you mean 'enableLegacyMetrics'?")


def test_feature_gate_value_must_be_a_go_bool() -> None:
    (issue,) = errors("featureGates: ['flowControl=maybe']\n").issues
    assert issue.path == "featureGates[0]"
    assert issue.message == "'maybe' is not a valid value for feature gate 'flowControl'"
    for good in ("flowControl=true", "flowControl=FALSE", "flowControl= 0 ", "flowControl=t"):
        load(f"featureGates: ['{good}']\n")


def test_feature_gate_errors_come_with_the_other_errors() -> None:
    err = errors("featureGates: [x]\nschedulingProfile: []\n")
    assert {i.path for i in err.issues} == {"featureGates[0]", "schedulingProfile"}


@pytest.mark.parametrize("gate", [g for g in FEATURE_GATES if g.name != "flowControl"], ids=lambda g: g.name)
def test_known_feature_gate_epick_does_not_act_on_warns_naming_it(gate: Any) -> None:
    config = load(f"featureGates: [{gate.name}, '{gate.name}=false']\n")
    assert config.warnings == [
        f"feature gate {entry!r} is accepted but not used: epick does not act on it "
        f"(upstream, {gate.name} enables {gate.enables}; "
        f"{'on' if gate.enabled_by_default else 'off'} by default)"
        for entry in (gate.name, f"{gate.name}=false")
    ]


def test_no_feature_gates_no_warning() -> None:
    assert load("featureGates: []\n").warnings == []
    assert load("featureGates:\n").warnings == []


# --- docs/plugins.md -----------------------------------------------------------------------------------


def _doc_section() -> str:
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    assert text.count(DOC_HEADING) == 1, f"docs/plugins.md needs one '{DOC_HEADING}' section"
    section = text.split(DOC_HEADING, 1)[1]
    following = re.search(r"^## ", section, re.M)
    return section[: following.start()] if following else section


def test_docs_list_exactly_the_upstream_types_epick_lacks() -> None:
    section = _doc_section()
    listed = re.findall(r"^\| `([^`]+)`", section, re.M)
    assert listed == [t.name for t in MISSING]
    table = section[section.index("| type |") :].rstrip("\n") + "\n"
    assert table == missing_types_table(EPICK_TYPES), (
        "regenerate the table with: python -c 'from epick.config.upstream import missing_types_table; "
        "from epick.plugins import in_tree_registry; print(missing_types_table(in_tree_registry().types()))'"
    )
