"""`disaggregatedset-rollout-screener`: revision shares (sum, max-role), the weighted draw, strict and
prefer header selectors, disabled mode, response-header stamping, parameter errors, and upstream's
README config deciding requests. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import Clock, CycleState, Endpoint, Plugin, Response
from epick.framework.labels import SelectorError, parse_label_selector
from epick.plugins import in_tree_registry
from epick.plugins.registry import Registry
from epick.plugins.screeners.disaggregatedset_rollout import (
    DEFAULT_REVISION_LABEL,
    DEFAULT_ROLE_LABEL,
    MAX_ROLE,
    SPEC,
    SUM,
    DisaggregatedSetRolloutScreener,
    pick_revision,
    shares_of,
)
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

README_CONFIG = (
    Path(__file__).resolve().parents[1] / "config/upstream/llm-d-router/disaggregatedset-rollout-readme.yaml"
)
SET = "disaggregatedset.x-k8s.io/name"
SLICE = "disaggregatedset.x-k8s.io/slice"
REVISION_HEADER = "x-disagg-revision"
SLICE_HEADER = "x-disagg-slice"


class _Handle:
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def plugin(self, name: str) -> Plugin:
        raise LookupError(name, "no plugins here")

    def rng(self, name: str) -> random.Random:
        return random.Random(self.seed)

    clock = Clock()  # the config's clock, as the loader's handle gives it
    workers = 1
    plugin_state_staleness = 300.0


def build(seed: int = 0, **params: Any) -> DisaggregatedSetRolloutScreener:
    params.setdefault("scope", {"labelSelector": f"{SET}=my-set"})
    params.setdefault(
        "revisionGating", {"mode": "max-role", "requireRoles": {"values": ["prefill", "decode"]}}
    )
    plugin = SPEC.factory("rs", SPEC.parameters.model_validate(params), _Handle(seed))
    assert isinstance(plugin, DisaggregatedSetRolloutScreener)
    return plugin


SELECTORS = [
    {"name": "revision", "headerName": REVISION_HEADER, "labelKey": DEFAULT_REVISION_LABEL, "mode": "strict"},
    {"name": "slice", "headerName": SLICE_HEADER, "labelKey": SLICE, "mode": "prefer"},
]


def pod(
    name: str, revision: str | None, role: str | None, *, set_name: str = "my-set", **extra: str
) -> Endpoint:
    labels = {SET: set_name, **extra}
    if revision is not None:
        labels[DEFAULT_REVISION_LABEL] = revision
    if role is not None:
        labels[DEFAULT_ROLE_LABEL] = role
    return make_endpoint(name, labels=labels)


def fleet(counts: Mapping[str, Mapping[str, int]]) -> list[Endpoint]:
    """Pods named <revision>-<role>-<i>, `counts[revision][role]` of each."""
    return [
        pod(f"{rev}-{role}-{i}", rev, role)
        for rev, per_role in counts.items()
        for role, n in per_role.items()
        for i in range(n)
    ]


def names(endpoints: Sequence[Endpoint]) -> list[str]:
    return [ep.name for ep in endpoints]


def revisions(endpoints: Sequence[Endpoint]) -> set[str]:
    return {ep.labels.get(DEFAULT_REVISION_LABEL, "") for ep in endpoints}


def screen(
    plugin: DisaggregatedSetRolloutScreener, endpoints: Sequence[Endpoint], **headers: str
) -> list[Endpoint]:
    request = make_request(headers={k.replace("_", "-"): v for k, v in headers.items()})
    return list(plugin.screen(request, CycleState(), endpoints))


# --- the distribution ---------------------------------------------------------------------------------

# README: 2P:10D mid-rollout: A has 2 prefill + 9 decode, B has 1 prefill + 1 decode.
README_COUNTS = {"A": {"prefill": 2, "decode": 9}, "B": {"prefill": 1, "decode": 1}}
ROLES = ("prefill", "decode")


def test_sum_weighs_a_revision_by_its_required_pods() -> None:
    # A: 2 + 9 = 11, B: 1 + 1 = 2, total 13.
    assert shares_of(README_COUNTS, ROLES, SUM) == pytest.approx({"A": 11 / 13, "B": 2 / 13})


def test_max_role_weighs_every_revision_by_the_globally_largest_role() -> None:
    # totals: prefill 3, decode 10 -> decode; A 9, B 1 of 10.
    assert shares_of(README_COUNTS, ROLES, MAX_ROLE) == pytest.approx({"A": 0.9, "B": 0.1})


@pytest.mark.parametrize(
    ("old", "new", "old_share"),
    [
        ({"decode": 6, "prefill": 1}, {"decode": 4, "prefill": 1}, 0.6),  # README planner step 4
        ({"decode": 4, "prefill": 1}, {"decode": 6, "prefill": 1}, 0.4),  # step 6
        ({"decode": 2, "prefill": 1}, {"decode": 8, "prefill": 1}, 0.2),
    ],  # step 8
)
def test_max_role_matches_the_readme_rollout_steps(
    old: dict[str, int], new: dict[str, int], old_share: float
) -> None:
    assert shares_of({"old": old, "new": new}, ROLES, MAX_ROLE) == pytest.approx(
        {"old": old_share, "new": 1 - old_share}
    )


@pytest.mark.parametrize("mode", [SUM, MAX_ROLE])
def test_a_revision_missing_a_required_role_gets_share_zero(mode: str) -> None:
    # README planner step 3: the new revision has 2 decode and no prefill.
    counts = {"old": {"decode": 6, "prefill": 1}, "new": {"decode": 2}}
    assert shares_of(counts, ROLES, mode) == {"old": 1.0, "new": 0.0}


def test_max_role_counts_only_covered_revisions_for_the_dominant_role() -> None:
    # C (20 prefill, no decode) is not covered, so prefill totals 3 and decode 10: decode dominates.
    counts = {**README_COUNTS, "C": {"prefill": 20}}
    assert shares_of(counts, ROLES, MAX_ROLE) == pytest.approx({"A": 0.9, "B": 0.1, "C": 0.0})


def test_max_role_breaks_a_tie_by_the_order_of_require_roles() -> None:
    # prefill 2 + 1 = 3 = decode 1 + 2.
    counts = {"A": {"prefill": 2, "decode": 1}, "B": {"prefill": 1, "decode": 2}}
    assert shares_of(counts, ("prefill", "decode"), MAX_ROLE) == pytest.approx({"A": 2 / 3, "B": 1 / 3})
    assert shares_of(counts, ("decode", "prefill"), MAX_ROLE) == pytest.approx({"A": 1 / 3, "B": 2 / 3})


def test_no_covered_revision_has_no_share() -> None:
    assert shares_of({"A": {"prefill": 1}}, ROLES, SUM) == {"A": 0.0}
    assert shares_of({}, ROLES, MAX_ROLE) == {}


def test_only_required_roles_weigh() -> None:
    # the encode pods are neither required nor counted: A 1 + 1 = 2, B 1 + 3 = 4.
    counts = {"A": {"prefill": 1, "decode": 1, "encode": 10}, "B": {"prefill": 1, "decode": 3}}
    assert shares_of(counts, ROLES, SUM) == pytest.approx({"A": 1 / 3, "B": 2 / 3})


def test_the_distribution_counts_scoped_pods_with_both_labels_once_each() -> None:
    plugin = build()
    endpoints = [
        *fleet(README_COUNTS),
        pod("other-set", "A", "prefill", set_name="other"),  # out of scope
        pod("no-role", "A", None),  # not counted
        pod("no-revision", None, "decode"),  # not counted
    ]
    # two rank endpoints of one pod count once
    rank = dataclasses.replace(endpoints[0], name="A-prefill-0-rank-1", pod_name="A-prefill-0")
    endpoints[0] = dataclasses.replace(endpoints[0], name="A-prefill-0-rank-0", pod_name="A-prefill-0")
    endpoints.append(rank)
    assert plugin.role_counts(endpoints) == {
        "A": {"prefill": 2, "decode": 9},
        "B": {"prefill": 1, "decode": 1},
    }
    assert plugin.revision_shares(endpoints) == pytest.approx({"A": 0.9, "B": 0.1})


def test_custom_revision_and_role_label_keys() -> None:
    plugin = build(
        revisionGating={
            "mode": "sum",
            "requireRoles": {"values": ["p", "d"]},
            "revisionLabelKey": "rev",
            "roleLabelKey": "role",
        }
    )
    eps = [
        make_endpoint(n, labels={SET: "my-set", "rev": r, "role": ro})
        for n, r, ro in [("a1", "x", "p"), ("a2", "x", "d"), ("b1", "y", "p")]
    ]
    eps += fleet({"x": {"p": 1, "d": 1}, "z": {"p": 1, "d": 1}})  # the default keys mean nothing here
    assert plugin.revision_shares(eps) == {"x": 1.0, "y": 0.0}
    assert names(screen(plugin, eps)) == ["a1", "a2"]


# --- the draw -----------------------------------------------------------------------------------------


def test_pick_revision_walks_the_sorted_cumulative_shares() -> None:
    shares = {"B": 0.1, "A": 0.9}  # sorted: A [0, 0.9), B [0.9, 1)
    assert pick_revision(shares, 0.0) == "A"
    assert pick_revision(shares, 0.89) == "A"
    assert pick_revision(shares, 0.9) == "B"
    assert pick_revision(shares, 0.999) == "B"
    assert pick_revision({"A": 0.0}, 0.5) == ""
    assert pick_revision({}, 0.5) == ""


@pytest.mark.parametrize(("mode", "share_a"), [(MAX_ROLE, 0.9), (SUM, 11 / 13)])
def test_the_draw_over_many_requests_follows_the_shares(mode: str, share_a: float) -> None:
    plugin = build(seed=7, revisionGating={"mode": mode, "requireRoles": {"values": ["prefill", "decode"]}})
    endpoints = fleet(README_COUNTS)
    seen: Counter[str] = Counter()
    n = 20_000
    for _ in range(n):
        kept = screen(plugin, endpoints)
        assert len(revisions(kept)) == 1  # one revision for every profile
        # every pod of the chosen revision stays
        rev = revisions(kept).pop()
        assert len(kept) == sum(README_COUNTS[rev].values())
        seen[rev] += 1
    # binomial standard deviation at n=20000 is at most 0.0036; 0.015 is over 4 of them
    assert seen["A"] / n == pytest.approx(share_a, abs=0.015)
    assert seen["B"] / n == pytest.approx(1 - share_a, abs=0.015)


def test_the_draw_is_deterministic_under_a_seed() -> None:
    endpoints = fleet(README_COUNTS)
    a, b = build(seed=3), build(seed=3)
    assert [names(screen(a, endpoints)) for _ in range(50)] == [
        names(screen(b, endpoints)) for _ in range(50)
    ]


def test_gating_drops_uncovered_revisions_and_unlabelled_endpoints() -> None:
    plugin = build()
    endpoints = [*fleet({"old": {"prefill": 1, "decode": 2}, "new": {"decode": 2}}), pod("bare", None, None)]
    for _ in range(20):
        assert names(screen(plugin, endpoints)) == ["old-prefill-0", "old-decode-0", "old-decode-1"]


def test_gating_with_no_covered_revision_keeps_nothing() -> None:
    plugin = build()
    assert screen(plugin, fleet({"A": {"prefill": 2}, "B": {"decode": 2}})) == []


def test_an_out_of_scope_candidate_of_a_covered_revision_is_kept() -> None:
    # As upstream: scope decides what is counted; screening is by revision label.
    plugin = build()
    endpoints = [
        *fleet({"A": {"prefill": 1, "decode": 1}}),
        pod("A-elsewhere", "A", "decode", set_name="other"),
    ]
    assert names(screen(plugin, endpoints)) == ["A-prefill-0", "A-decode-0", "A-elsewhere"]


# --- header selectors ---------------------------------------------------------------------------------


def test_a_strict_header_keeps_its_revision_without_a_draw() -> None:
    plugin = build(headerSelectors=SELECTORS)
    endpoints = fleet(README_COUNTS)
    for _ in range(20):
        kept = screen(plugin, endpoints, x_disagg_revision="B")
        assert names(kept) == ["B-prefill-0", "B-decode-0"]


def test_a_strict_header_naming_an_uncovered_revision_keeps_nothing() -> None:
    plugin = build(headerSelectors=SELECTORS)
    endpoints = fleet({"A": {"prefill": 1, "decode": 1}, "B": {"decode": 1}})
    assert screen(plugin, endpoints, x_disagg_revision="B") == []


def test_a_strict_header_that_matches_nothing_keeps_nothing_and_is_counted() -> None:
    plugin = build(headerSelectors=SELECTORS)
    assert screen(plugin, fleet(README_COUNTS), x_disagg_revision="Z") == []
    assert plugin.strict_no_match == {"revision": 1}


def test_a_strict_selector_on_another_axis_suppresses_the_draw() -> None:
    # slice is strict here: the request names slice s1, so no revision is drawn; both covered
    # revisions stay and the slice selector keeps s1's pods of either.
    selectors = [{"name": "slice", "headerName": SLICE_HEADER, "labelKey": SLICE, "mode": "strict"}]
    plugin = build(headerSelectors=selectors)
    endpoints = [
        pod("a-p", "A", "prefill", **{SLICE: "s1"}),
        pod("a-d", "A", "decode", **{SLICE: "s2"}),
        pod("b-p", "B", "prefill", **{SLICE: "s2"}),
        pod("b-d", "B", "decode", **{SLICE: "s1"}),
    ]
    for _ in range(20):
        assert names(screen(plugin, endpoints, x_disagg_slice="s1")) == ["a-p", "b-d"]


def test_an_empty_strict_header_counts_as_absent() -> None:
    plugin = build(seed=1, headerSelectors=SELECTORS)
    kept = screen(plugin, fleet(README_COUNTS), x_disagg_revision="")
    assert len(revisions(kept)) == 1


def test_a_prefer_selector_never_screens() -> None:
    plugin = build(headerSelectors=SELECTORS, revisionGating={"mode": "disabled"})
    endpoints = [pod("a", "A", "decode", **{SLICE: "s1"}), pod("b", "B", "decode", **{SLICE: "s2"})]
    assert names(screen(plugin, endpoints, x_disagg_slice="s1")) == ["a", "b"]
    assert names(screen(plugin, endpoints, x_disagg_slice="nowhere")) == ["a", "b"]


def test_header_names_are_matched_lower_cased() -> None:
    selectors = [
        {"name": "r", "headerName": "X-Disagg-Revision", "labelKey": DEFAULT_REVISION_LABEL, "mode": "strict"}
    ]
    plugin = build(headerSelectors=selectors)
    assert plugin.header_selectors[0].header_name == REVISION_HEADER
    request = make_request(headers={"X-DISAGG-REVISION": "B"})
    assert names(plugin.screen(request, CycleState(), fleet(README_COUNTS))) == ["B-prefill-0", "B-decode-0"]


# --- disabled -----------------------------------------------------------------------------------------


def test_disabled_keeps_every_candidate_but_applies_strict_selectors() -> None:
    plugin = build(headerSelectors=SELECTORS, revisionGating={"mode": "disabled"})
    endpoints = [*fleet({"A": {"prefill": 1}, "B": {"decode": 1}}), pod("bare", None, None)]
    assert names(screen(plugin, endpoints)) == ["A-prefill-0", "B-decode-0", "bare"]
    assert names(screen(plugin, endpoints, x_disagg_revision="A")) == ["A-prefill-0"]
    assert screen(plugin, endpoints, x_disagg_revision="Z") == []


def test_disabled_ignores_require_roles() -> None:
    plugin = build(revisionGating={"mode": "disabled", "requireRoles": {"values": []}})
    assert not plugin.gating.active


# --- response headers ---------------------------------------------------------------------------------


def test_every_selector_stamps_the_serving_endpoints_label() -> None:
    plugin = build(headerSelectors=SELECTORS)
    response = Response("r1")
    plugin.response_received(make_request(), response, pod("a", "A", "decode", **{SLICE: "s1"}))
    assert response.add_headers == {REVISION_HEADER: "A", SLICE_HEADER: "s1"}


def test_a_missing_or_empty_label_stamps_nothing() -> None:
    plugin = build(headerSelectors=SELECTORS, revisionGating={"mode": "disabled"})
    response = Response("r1")
    plugin.response_received(make_request(), response, pod("a", None, "decode", **{SLICE: ""}))
    assert response.add_headers == {}


# --- label selectors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a!=1", {"a": "1"}, False),
        ("a in (1, 2),b", {"a": "2", "b": ""}, True),
        ("a in (1,2),b", {"a": "2"}, False),
        ("a notin (1,2)", {}, True),
        ("!a", {"a": "x"}, False),
        ("a=", {"a": ""}, True),
        ("a>5", {"a": "6"}, True),
        ("a<5", {"a": "x"}, False),
        ("example.com/a=x, b", {"example.com/a": "x", "b": "y"}, True),
        ("", {"anything": "x"}, True),
        ("   ", {}, True),
    ],
)
def test_label_selectors_match_as_kubernetes(text: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(text).matches(labels) is expected


@pytest.mark.parametrize(
    "text",
    [
        "a=1,",
        ",a",
        "a in 1",
        "a in (1",
        "a in (1 2)",
        "a=b=c",
        "a>x",
        "!",
        "a b",
        "-a=1",
        "a/b/c",
        "/a",
        "a=-x",
        "in=1",
    ],
)
def test_bad_label_selectors_raise(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(text)


# --- parameters ---------------------------------------------------------------------------------------


def registry() -> Registry:
    reg = in_tree_registry()
    if SPEC.type not in reg:
        reg.register(SPEC)
    return reg


def config_with(parameters: str) -> str:
    return (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- type: disaggregatedset-rollout-screener\n  name: rs\n" + parameters + "- type: queue-scorer\n"
    )


GOOD_GATING = "    revisionGating: {mode: sum, requireRoles: {values: [prefill, decode]}}\n"
SCOPE = "    scope: {labelSelector: 'a=b'}\n"
SELECTOR = "{name: r, headerName: x-r, labelKey: rev, mode: strict}"


@pytest.mark.parametrize(
    ("parameters", "path"),
    [
        ("", "scope.labelSelector"),
        ("  parameters:\n" + GOOD_GATING, "scope.labelSelector"),
        ("  parameters:\n    scope: {labelSelector: 'a in (b'}\n" + GOOD_GATING, "scope.labelSelector"),
        ("  parameters:\n" + SCOPE, "revisionGating"),
        ("  parameters:\n" + SCOPE + "    revisionGating: {mode: round-robin}\n", "revisionGating.mode"),
        ("  parameters:\n" + SCOPE + "    revisionGating: {}\n", "revisionGating.mode"),
        ("  parameters:\n" + SCOPE + "    revisionGating: {mode: max-role}\n", "revisionGating.requireRoles"),
        (
            "  parameters:\n" + SCOPE + "    revisionGating: {mode: sum, requireRoles: {values: []}}\n",
            "revisionGating.requireRoles.values",
        ),
        (
            "  parameters:\n" + SCOPE + "    revisionGating: {mode: sum, requireRoles: {values: [p, '']}}\n",
            "revisionGating.requireRoles.values[1]",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + "    revisionGating: {mode: sum, requireRoles: {values: [p, d, p]}}\n",
            "revisionGating.requireRoles.values[2]",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + GOOD_GATING
            + "    headerSelectors: [{headerName: x, labelKey: l, mode: strict}]\n",
            "headerSelectors[0].name",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + GOOD_GATING
            + "    headerSelectors: [{name: n, labelKey: l, mode: strict}]\n",
            "headerSelectors[0].headerName",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + GOOD_GATING
            + "    headerSelectors: [{name: n, headerName: x, mode: strict}]\n",
            "headerSelectors[0].labelKey",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + GOOD_GATING
            + "    headerSelectors: [{name: n, headerName: x, labelKey: l}]\n",
            "headerSelectors[0].mode",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + GOOD_GATING
            + "    headerSelectors: [{name: n, headerName: x, labelKey: l, mode: hard}]\n",
            "headerSelectors[0].mode",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + GOOD_GATING
            + f"    headerSelectors: [{SELECTOR}, {{name: r, headerName: x-s, labelKey: l, mode: prefer}}]\n",
            "headerSelectors[1].name",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + GOOD_GATING
            + f"    headerSelectors: [{SELECTOR}, {{name: s, headerName: X-R, labelKey: l, mode: prefer}}]\n",
            "headerSelectors[1].headerName",
        ),
        (
            "  parameters:\n"
            + SCOPE
            + GOOD_GATING
            + "    headerSelectors: [{name: n, headerName: x, labelKey: l, mode: strict, weight: 2}]\n",
            "headerSelectors[0].weight",
        ),
        ("  parameters:\n" + SCOPE + GOOD_GATING + "    extra: 1\n", "extra"),
    ],
)
def test_bad_parameters_are_config_errors_at_their_path(parameters: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(config_with(parameters), registry=registry())
    paths = [issue.path for issue in info.value.issues]
    assert f"plugins[0].parameters.{path}" in paths, paths


def test_good_parameters_load_with_defaults() -> None:
    config = load_config_text(config_with("  parameters:\n" + SCOPE + GOOD_GATING), registry=registry())
    plugin = config.plugins["rs"]
    assert isinstance(plugin, DisaggregatedSetRolloutScreener)
    assert plugin.gating.revision_label_key == DEFAULT_REVISION_LABEL
    assert plugin.gating.role_label_key == DEFAULT_ROLE_LABEL
    assert plugin.gating.require_roles == ("prefill", "decode")
    assert plugin.header_selectors == ()
    assert config.hooks.screeners == [plugin]
    assert plugin in config.hooks.response_received


# --- upstream's README config -------------------------------------------------------------------------


def readme_path(seed: int = 0) -> RequestPath:
    return RequestPath(load_config_text(README_CONFIG.read_text(), registry=registry(), seed=seed))


def test_the_readme_config_loads() -> None:
    config = load_config_text(README_CONFIG.read_text(), registry=registry())
    plugin = config.plugins["rollout-screener"]
    assert isinstance(plugin, DisaggregatedSetRolloutScreener)
    assert plugin.gating.mode == MAX_ROLE
    assert [s.mode for s in plugin.header_selectors] == ["strict", "prefer"]


def readme_fleet() -> tuple[Endpoint, ...]:
    return (
        pod("a-p", "rev-a", "prefill", **{SLICE: "s1"}),
        pod("a-d", "rev-a", "decode", **{SLICE: "s1"}),
        pod("b-p", "rev-b", "prefill", **{SLICE: "s2"}),
        pod("b-d1", "rev-b", "decode", **{SLICE: "s2"}),
        pod("b-d2", "rev-b", "decode", **{SLICE: "s1"}),
    )


def test_the_readme_config_keeps_a_strict_revision() -> None:
    path = readme_path()
    for _ in range(20):
        result = path.decide(make_request(headers={REVISION_HEADER: "rev-a"}), readme_fleet())
        assert {ep.labels[DEFAULT_REVISION_LABEL] for ep in result.targets} == {"rev-a"}


def test_the_readme_config_decides_on_one_revision_by_share_and_stamps_it() -> None:
    # max-role: prefill 1 + 1 = 2, decode 1 + 2 = 3 -> decode; rev-a 1/3, rev-b 2/3.
    path = readme_path(seed=11)
    screener = path.config.plugins["rollout-screener"]
    seen: Counter[str] = Counter()
    n = 3000
    for i in range(n):
        request = make_request(request_id=f"r{i}")
        result = path.decide(request, readme_fleet())
        target = result.targets[0]
        seen[target.labels[DEFAULT_REVISION_LABEL]] += 1
        if i == 0:
            response = Response(request.request_id)
            for hook in path.config.hooks.response_received:
                hook.response_received(request, response, target)
            assert response.add_headers[REVISION_HEADER] == target.labels[DEFAULT_REVISION_LABEL]
            assert response.add_headers[SLICE_HEADER] == target.labels[SLICE]
            assert screener in path.config.hooks.response_received
    assert seen["rev-a"] / n == pytest.approx(1 / 3, abs=0.04)


def test_the_readme_config_never_serves_an_incomplete_revision() -> None:
    endpoints = (*readme_fleet()[2:], pod("c-p", "rev-c", "prefill"))  # rev-a gone; rev-c has no decode
    path = readme_path()
    for _ in range(20):
        result = path.decide(make_request(), endpoints)
        assert result.targets[0].labels[DEFAULT_REVISION_LABEL] == "rev-b"


def test_the_readme_config_answers_503_when_the_strict_revision_cannot_serve() -> None:
    endpoints = (*readme_fleet()[2:], pod("c-p", "rev-c", "prefill"))
    with pytest.raises(RequestError) as info:
        readme_path().decide(make_request(headers={REVISION_HEADER: "rev-c"}), endpoints)
    assert (info.value.status, info.value.code) == (503, "screened_out")
    with pytest.raises(RequestError):
        readme_path().decide(make_request(headers={REVISION_HEADER: "rev-z"}), endpoints)
