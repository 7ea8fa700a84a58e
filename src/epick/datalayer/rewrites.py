"""Model rewrites: GIE's InferenceModelRewrite resources, which rename a request's model inside a pool
and split traffic between target models by weight (canaries, versions, aliases).

The resource, as GIE defines it (kubernetes-sigs/gateway-api-inference-extension,
docs/proposals/1816-inferenceomodelrewrite/README.md) and llm-d serves it (llm-d/llm-d-router,
config/crd/bases/llm-d.ai_inferencemodelrewrites.yaml):

    apiVersion: inference.networking.x-k8s.io/v1alpha2   # or llm-d.ai/v1alpha2
    kind: InferenceModelRewrite
    metadata: {name: canary}
    spec:
      poolRef: {name: my-pool}
      rules:
      - matches: [{model: {type: Exact, value: llama}}]   # none: every model
        targets:
        - {modelRewrite: llama-v1, weight: 90}
        - {modelRewrite: llama-v2, weight: 10}

Precedence, as GIE specifies it: an exact model match wins over a rule with no matches; between
resources, the oldest (creation timestamp) wins; within one, the first matching rule. Weights are
all given or none (then equal). Rewrites come from configuration only: a file or the cluster, never
from a client's header.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epick.datalayer.resources import pool_resource

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha2", "llm-d.ai/v1alpha2")
KIND = "InferenceModelRewrite"
MAX_WEIGHT = 1_000_000


class RewriteError(ValueError):
    """A resource that cannot be used; the message names the resource and the field."""


@dataclass(frozen=True, slots=True)
class Target:
    model: str
    weight: int


@dataclass(frozen=True, slots=True)
class Rule:
    models: frozenset[str]  # exact matches; empty: every model
    targets: tuple[Target, ...]

    def choose(self, rng: random.Random) -> str:
        if len(self.targets) == 1:
            return self.targets[0].model
        weights = [t.weight for t in self.targets]
        return rng.choices(self.targets, weights=weights)[0].model


@dataclass(frozen=True, slots=True)
class Rewrite:
    """One InferenceModelRewrite resource."""

    name: str
    pool: str
    created: str  # RFC 3339 creation timestamp ("" when unknown: sorts first, as the file gives it)
    rules: tuple[Rule, ...]


@dataclass(slots=True)
class ModelRewrites:
    """The rewrites of one pool. `target_model(model)` is the model to send, or None to leave it."""

    rewrites: tuple[Rewrite, ...] = ()
    rng: random.Random = field(default_factory=random.Random)
    _exact: dict[str, tuple[str, Rule]] = field(init=False, repr=False)
    _generic: tuple[str, Rule] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._exact = {}
        self._generic = None
        # Oldest resource first; within a resource, rules in order: the first match wins.
        for rewrite in sorted(self.rewrites, key=lambda r: (r.created, r.name)):
            for rule in rewrite.rules:
                if not rule.models:
                    if self._generic is None:
                        self._generic = (rewrite.name, rule)
                    continue
                for model in rule.models:
                    self._exact.setdefault(model, (rewrite.name, rule))

    def target_model(self, model: str) -> str | None:
        chosen = self.rewrite(model)
        return chosen[1] if chosen is not None else None

    def rewrite(self, model: str) -> tuple[str, str] | None:
        """The rewrite that matches `model` (the resource's name) and the model it chose, or None."""
        found = self._exact.get(model) or self._generic
        if found is None:
            return None
        name, rule = found
        return name, rule.choose(self.rng)

    def __len__(self) -> int:
        return len(self.rewrites)


def parse_rewrite(obj: Mapping[str, Any], where: str = "") -> Rewrite:
    """One resource, validated as the CRD validates it; `where` prefixes error messages."""
    r = pool_resource(obj, KIND, API_VERSIONS, where, RewriteError)
    rules = r.spec.get("rules")
    if not isinstance(rules, list) or not rules:
        raise RewriteError(f"{r.at}spec.rules must be a non-empty list")
    parsed = tuple(_rule(rule, f"{r.at}spec.rules[{i}]") for i, rule in enumerate(rules))
    return Rewrite(r.name, r.pool, r.created, parsed)


def _rule(raw: Any, at: str) -> Rule:
    if not isinstance(raw, Mapping):
        raise RewriteError(f"{at} must be a mapping")
    models: set[str] = set()
    for j, match in enumerate(raw.get("matches") or []):
        model = match.get("model") if isinstance(match, Mapping) else None
        if not isinstance(model, Mapping):
            raise RewriteError(f"{at}.matches[{j}].model is required")
        kind = model.get("type", "Exact")
        if kind != "Exact":
            raise RewriteError(f"{at}.matches[{j}].model.type must be Exact, got {kind!r}")
        value = model.get("value")
        if not isinstance(value, str) or not value:
            raise RewriteError(f"{at}.matches[{j}].model.value must be a non-empty string")
        models.add(value)
    targets = raw.get("targets")
    if not isinstance(targets, list) or not targets:
        raise RewriteError(f"{at}.targets must be a non-empty list of {{modelRewrite, weight}}")
    weighted = [isinstance(t, Mapping) and "weight" in t for t in targets]
    if any(weighted) and not all(weighted):
        raise RewriteError(f"{at}.targets: give a weight to every target or to none")
    out = []
    for j, t in enumerate(targets):
        model = t.get("modelRewrite") if isinstance(t, Mapping) else None
        if not isinstance(model, str) or not model:
            raise RewriteError(f"{at}.targets[{j}].modelRewrite must be a non-empty string")
        weight = t.get("weight", 1)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= MAX_WEIGHT:
            raise RewriteError(f"{at}.targets[{j}].weight must be an integer from 1 to {MAX_WEIGHT}")
        out.append(Target(model, weight))
    return Rule(frozenset(models), tuple(out))


def parse_rewrites(documents: Iterable[Any], where: str = "") -> list[Rewrite]:
    """Resources from YAML documents: each one a resource, a `...List` of them, or empty. `where`
    (a file name) prefixes error messages."""
    prefix = f"{where}: " if where else ""
    found: list[Rewrite] = []
    for i, doc in enumerate(documents):
        if doc is None:
            continue
        if isinstance(doc, Mapping) and str(doc.get("kind", "")).endswith("List"):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise RewriteError(f"{prefix}document {i}: items must be a list")
            found.extend(
                parse_rewrite(item, f"{prefix}document {i} items[{j}]") for j, item in enumerate(items)
            )
        else:
            found.append(parse_rewrite(doc, f"{prefix}document {i}"))
    names = [r.name for r in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise RewriteError(f"{prefix}{KIND} names given twice: {', '.join(duplicates)}")
    return found


def for_pool(rewrites: Iterable[Rewrite], pool: str | None) -> list[Rewrite]:
    """The rewrites whose poolRef names `pool` (all of them when `pool` is None)."""
    return [r for r in rewrites if pool is None or r.pool == pool]
