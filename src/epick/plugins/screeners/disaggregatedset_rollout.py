"""`disaggregatedset-rollout-screener` (llm-d, alpha): keep a prefill/decode request on one revision of
a DisaggregatedSet while it rolls out.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/screener/
disaggregatedsetrollout): a screener (it runs once per request, before the data producers and every
profile, so no later filter, scorer or picker can undo it; it is discovered from `plugins:` and never
named in a profile) that also stamps response headers.

Revision gating (`revisionGating.mode`):

- A revision is *covered* when each role of `requireRoles.values` has at least one Ready pod of that
  revision. Pods are told apart by their `revisionLabelKey` label (default
  `disaggregatedset.x-k8s.io/revision`) and `roleLabelKey` label (default
  `disaggregatedset.x-k8s.io/role`); a pod lacking either label is not counted.
- `sum`: a covered revision weighs the sum of its Ready pods over the required roles.
  `max-role`: the required role with the most Ready pods over all covered revisions (ties: the first
  in `requireRoles.values`) is the dominant role, and every covered revision weighs its Ready pods of
  that role. A revision's share is its weight over the total; an uncovered revision's share is 0.
- Every request keeps only the candidates whose revision has a share above 0 (none: 503). When no
  strict header selector names a value, one revision is then drawn at random by share (revisions in
  sorted order, cumulative shares) and only its candidates are kept, so the prefill and decode
  profiles see the same single revision.
- `disabled`: no coverage check and no draw; the header selectors and the stamping still apply.

Header selectors (`headerSelectors`, each `name`, `headerName` (lower-cased), `labelKey`, `mode`):
a `strict` selector whose request header is present and non-empty keeps only the candidates whose
`labelKey` label equals it (none: 503, never another value). A `prefer` selector never screens (a
separate `header-label-affinity-scorer` scores it). Every selector, strict or prefer, copies the
serving endpoint's `labelKey` label, when non-empty, into the response header `headerName`.

Parameters are required: `scope.labelSelector` (a Kubernetes label selector, "k=v,k2 in (a,b),!k3")
and `revisionGating` (with `requireRoles.values`, non-empty, no empty or repeated role, for `sum` and
`max-role`); selector names and header names are unique and every selector field is required.

Deliberate deviations from upstream:

- Upstream counts Ready pods from a Kubernetes Pod watch (the pods matching `scope.labelSelector`)
  and recomputes the distribution on every Pod event; until the first snapshot arrives it fails
  closed (503). epick computes the distribution per request from the request's candidates whose
  labels match `scope.labelSelector`: epick's candidates are exactly the Ready pods of the pool, with
  their labels. So there is no Pod watch and no warm-up period; a pod is counted once however many
  rank endpoints it serves (by pod name); and a Ready pod that matches the scope but is not in the
  pool is not counted (upstream would count it).
- Upstream's metrics (`llm_d_epp_disaggregatedset_strict_header_no_match_total` and the
  `..._revision_gating_share` gauge) are not exported; `strict_no_match` counts the strict no-match
  failures per selector name, and `revision_shares(endpoints)` gives the shares a request would see.
- The random draw is taken only when two or more revisions are eligible (upstream draws always; the
  outcome is the same).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads, Response
from epick.framework.labels import LabelSelector, SelectorError, parse_label_selector
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "disaggregatedset-rollout-screener"
DEFAULT_REVISION_LABEL = "disaggregatedset.x-k8s.io/revision"
DEFAULT_ROLE_LABEL = "disaggregatedset.x-k8s.io/role"

STRICT = "strict"
PREFER = "prefer"
SUM = "sum"
MAX_ROLE = "max-role"
DISABLED = "disabled"
_GATING_MODES = (SUM, MAX_ROLE, DISABLED)


# --- parameters -------------------------------------------------------------------------------------


class ScopeParameters(Parameters):
    label_selector: str = ""


class HeaderSelectorParameters(Parameters):
    name: str = ""
    header_name: str = ""
    label_key: str = ""
    mode: str = ""


class RequireRolesParameters(Parameters):
    values: list[str] | None = None


class RevisionGatingParameters(Parameters):
    mode: str = ""
    require_roles: RequireRolesParameters | None = None
    revision_label_key: str = ""
    role_label_key: str = ""


class RolloutScreenerParameters(Parameters):
    scope: ScopeParameters = Field(default_factory=ScopeParameters)
    header_selectors: list[HeaderSelectorParameters] | None = None
    revision_gating: RevisionGatingParameters | None = None


@dataclass(frozen=True, slots=True)
class HeaderSelector:
    name: str
    header_name: str  # lower-cased
    label_key: str
    mode: str  # STRICT or PREFER


@dataclass(frozen=True, slots=True)
class RevisionGating:
    mode: str  # SUM, MAX_ROLE or DISABLED
    require_roles: tuple[str, ...] = ()
    revision_label_key: str = DEFAULT_REVISION_LABEL
    role_label_key: str = DEFAULT_ROLE_LABEL

    @property
    def active(self) -> bool:
        return self.mode in (SUM, MAX_ROLE) and bool(self.require_roles)


# --- the distribution -------------------------------------------------------------------------------


def dominant_role(covered: Mapping[str, Mapping[str, int]], required: Sequence[str]) -> str:
    """The required role with the most Ready pods over the covered revisions; ties: the first."""
    best, best_count = "", -1
    for role in required:
        total = sum(per_role.get(role, 0) for per_role in covered.values())
        if total > best_count:
            best, best_count = role, total
    return best


def shares_of(
    role_counts: Mapping[str, Mapping[str, int]], required: Sequence[str], mode: str
) -> dict[str, float]:
    """Each revision's share (0..1) given its Ready pods by role; 0 for one missing a required role."""
    covered = {
        rev: per_role
        for rev, per_role in role_counts.items()
        if all(per_role.get(r, 0) > 0 for r in required)
    }
    if mode == MAX_ROLE:
        role = dominant_role(covered, required)
        weights = {rev: per_role.get(role, 0) for rev, per_role in covered.items()}
    else:
        weights = {rev: sum(per_role.get(r, 0) for r in required) for rev, per_role in covered.items()}
    total = sum(weights.values())
    return {rev: (weights.get(rev, 0) / total if total > 0 else 0.0) for rev in role_counts}


def pick_revision(shares: Mapping[str, float], draw: float) -> str:
    """The revision `draw` (in [0, 1)) lands on, revisions sorted, by cumulative share; "" for none."""
    revisions = sorted(rev for rev, share in shares.items() if share > 0)
    total = sum(shares[rev] for rev in revisions)
    if not revisions or total <= 0:
        return ""
    x = draw * total
    cumulative = 0.0
    for rev in revisions:
        cumulative += shares[rev]
        if x < cumulative:
            return rev
    return revisions[-1]


# --- the plugin -------------------------------------------------------------------------------------


class DisaggregatedSetRolloutScreener(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS | Reads.HISTORY  # and the candidates' labels; a random draw

    def __init__(
        self,
        name: str | None,
        scope: LabelSelector,
        header_selectors: Sequence[HeaderSelector],
        gating: RevisionGating,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name)
        self.scope = scope
        self.header_selectors = tuple(header_selectors)
        self.strict_selectors = tuple(s for s in self.header_selectors if s.mode == STRICT)
        self.gating = gating
        self._rng = rng or random.Random()
        self.strict_no_match: Counter[str] = Counter()  # by selector name

    def role_counts(self, endpoints: Sequence[Endpoint]) -> dict[str, dict[str, int]]:
        """Ready pods by revision and role: the candidates matching the scope with both labels, each
        pod once (rank endpoints of one pod share its name and labels)."""
        revision_key, role_key = self.gating.revision_label_key, self.gating.role_label_key
        counts: dict[str, dict[str, int]] = {}
        seen: set[str] = set()
        for ep in endpoints:
            pod = ep.pod_name or ep.name
            if pod in seen:
                continue
            labels = ep.labels
            revision, role = labels.get(revision_key, ""), labels.get(role_key, "")
            if not revision or not role or not self.scope.matches(labels):
                continue
            seen.add(pod)
            per_role = counts.setdefault(revision, {})
            per_role[role] = per_role.get(role, 0) + 1
        return counts

    def revision_shares(self, endpoints: Sequence[Endpoint]) -> dict[str, float]:
        """Each observed revision's share, as a request with these candidates sees it."""
        return shares_of(self.role_counts(endpoints), self.gating.require_roles, self.gating.mode)

    def _has_strict_header(self, request: InferenceRequest) -> bool:
        return any(request.headers.get(s.header_name, "") for s in self.strict_selectors)

    def screen(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        current = list(endpoints)
        if self.gating.active:
            revision_key = self.gating.revision_label_key
            shares = self.revision_shares(endpoints)
            present = {ep.labels.get(revision_key, "") for ep in current}
            allowed = {rev: shares[rev] for rev in present if shares.get(rev, 0.0) > 0}
            chosen = ""
            if not self._has_strict_header(request) and allowed:
                chosen = (
                    pick_revision(allowed, self._rng.random()) if len(allowed) > 1 else next(iter(allowed))
                )
            current = [
                ep
                for ep in current
                if (rev := ep.labels.get(revision_key, "")) in allowed and (not chosen or rev == chosen)
            ]
            if not current:
                return current
        return self._screen_strict(request, current)

    def _screen_strict(self, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        current = endpoints
        for selector in self.strict_selectors:
            if not current:
                break
            wanted = request.headers.get(selector.header_name, "")
            if not wanted:
                continue
            current = [ep for ep in current if ep.labels.get(selector.label_key) == wanted]
            if not current:
                self.strict_no_match[selector.name] += 1
        return current

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        for selector in self.header_selectors:
            value = endpoint.labels.get(selector.label_key, "")
            if value:
                response.add_headers[selector.header_name] = value


# --- the factory ------------------------------------------------------------------------------------


def _header_selectors(params: RolloutScreenerParameters) -> list[HeaderSelector]:
    selectors: list[HeaderSelector] = []
    names: set[str] = set()
    headers: set[str] = set()
    for i, raw in enumerate(params.header_selectors or []):
        where = f"headerSelectors[{i}]"
        for field, alias in (("name", "name"), ("header_name", "headerName"), ("label_key", "labelKey")):
            if not getattr(raw, field):
                raise ParameterError(f"{where}.{alias}", f"{where}.{alias} is required", f"set {alias}")
        if raw.mode not in (STRICT, PREFER):
            raise ParameterError(
                f"{where}.mode",
                f"{where}.mode {raw.mode!r} must be one of strict|prefer",
                "use strict or prefer",
            )
        header = raw.header_name.lower()
        if raw.name in names:
            raise ParameterError(
                f"{where}.name", f"headerSelectors: duplicate name {raw.name!r}", "rename it"
            )
        if header in headers:
            raise ParameterError(
                f"{where}.headerName",
                f"headerSelectors: duplicate headerName {header!r}",
                "use each header in one selector",
            )
        names.add(raw.name)
        headers.add(header)
        selectors.append(HeaderSelector(raw.name, header, raw.label_key, raw.mode))
    return selectors


def _gating(params: RolloutScreenerParameters) -> RevisionGating:
    raw = params.revision_gating
    if raw is None:
        raise ParameterError(
            "revisionGating",
            "revisionGating is required",
            "add revisionGating: {mode: max-role, requireRoles: {values: [prefill, decode]}}"
            " (or mode: disabled)",
        )
    revision_key = raw.revision_label_key or DEFAULT_REVISION_LABEL
    role_key = raw.role_label_key or DEFAULT_ROLE_LABEL
    if raw.mode == DISABLED:
        return RevisionGating(DISABLED, (), revision_key, role_key)
    if raw.mode not in _GATING_MODES:
        raise ParameterError(
            "revisionGating.mode",
            f"revisionGating.mode {raw.mode!r} must be one of sum|max-role|disabled",
            "use sum, max-role or disabled",
        )
    if raw.require_roles is None:
        raise ParameterError(
            "revisionGating.requireRoles",
            f"revisionGating.requireRoles is required when revisionGating.mode={raw.mode}",
            "add requireRoles: {values: [prefill, decode]}",
        )
    roles = raw.require_roles.values or []
    if not roles:
        raise ParameterError(
            "revisionGating.requireRoles.values",
            "revisionGating.requireRoles.values must contain at least one role",
            "list the roles every revision needs, e.g. [prefill, decode]",
        )
    seen: set[str] = set()
    for i, role in enumerate(roles):
        where = f"revisionGating.requireRoles.values[{i}]"
        if not role:
            raise ParameterError(where, f"{where} must not be empty", "name a role")
        if role in seen:
            raise ParameterError(
                where, f"revisionGating.requireRoles.values contains duplicate role {role!r}", "list it once"
            )
        seen.add(role)
    return RevisionGating(raw.mode, tuple(roles), revision_key, role_key)


def _factory(name: str, params: RolloutScreenerParameters, handle: Handle) -> DisaggregatedSetRolloutScreener:
    text = params.scope.label_selector
    if not text:
        required = "scope.labelSelector is required"
        if not params.model_fields_set:
            required = f"requires parameters: {required}, and so is revisionGating"
        raise ParameterError(
            "scope.labelSelector", required, 'select the pods, e.g. scope: {labelSelector: "app=my-set"}'
        )
    try:
        scope = parse_label_selector(text)
    except SelectorError as e:
        raise ParameterError(
            "scope.labelSelector",
            f"scope.labelSelector is not a valid label selector: {e}",
            'write a Kubernetes label selector, e.g. "k=v,k2 in (a,b)"',
        ) from None
    selectors = _header_selectors(params)
    gating = _gating(params)
    return DisaggregatedSetRolloutScreener(name, scope, selectors, gating, handle.rng(name))


SPEC = PluginSpec(
    TYPE,
    _factory,
    RolloutScreenerParameters,
    "keep a request on one covered DisaggregatedSet revision, drawn by share; strict header selectors",
    worker_state="",
)
