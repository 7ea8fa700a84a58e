"""Under `epick serve --workers N` each worker decides with its own copy of every plugin. A plugin
that says it keeps nothing per worker (its spec's `worker_state` is "", or it is `Replicated` and its
copies exchange updates) must decide the same whether one copy sees every request or two copies take
turns: this test replays one sequence of decisions both ways, for every in-tree scorer, filter and
picker, and catches a plugin whose state diverges silently (the round-robin picker's turn did)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from epick.framework import (
    CycleState,
    Endpoint,
    Filter,
    InferenceRequest,
    Picker,
    PreRequest,
    ProfileRunResult,
    SchedulingResult,
    ScoredEndpoint,
    Scorer,
)
from epick.framework.replication import Replicated, unshared_state
from epick.plugins import in_tree_plugins
from epick.plugins.registry import PluginSpec
from tests.builders import make_endpoint, make_request
from tests.plugins.test_properties import REQUIRED_PARAMETERS, _Handle


class _SharedRng(_Handle):
    """One random source for every copy: the draws come in the order the decisions are made, as in
    one process, so a random choice is no divergence."""

    def __init__(self) -> None:
        self.shared = random.Random(7)

    def rng(self, name: str) -> random.Random:
        return self.shared


ENDPOINTS = [
    make_endpoint(f"ep{i}", queue=q, running=r, kv=kv)
    for i, (q, r, kv) in enumerate([(3, 1, 0.2), (0, 4, 0.5), (7, 0, 0.1), (1, 2, 0.9)])
]
REQUESTS = [
    make_request(text, model="m", request_id=f"r{i}")
    for i, text in enumerate(["shared prefix " * 8 + suffix for suffix in "abcdabcdab"])
]


def _decide(plugin: Any, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> object:
    """One decision with `plugin`, and what it records of it (its PreRequest, on the first endpoint
    it would send to)."""
    state = CycleState()
    if isinstance(plugin, Scorer):
        out: object = [round(s, 9) for s in plugin.score(request, state, endpoints)]
        chosen = endpoints[0]
    elif isinstance(plugin, Filter):
        kept = plugin.filter(request, state, endpoints)
        out = [ep.name for ep in kept]
        chosen = kept[0] if kept else endpoints[0]
    else:
        assert isinstance(plugin, Picker)
        scored = [ScoredEndpoint(ep, 0.5 + 0.1 * i) for i, ep in enumerate(endpoints)]
        result = plugin.pick(request, state, scored)
        out = [t.name for t in result.targets]
        chosen = result.targets[0] if result.targets else endpoints[0]
    if isinstance(plugin, PreRequest):
        plugin.pre_request(
            request, SchedulingResult({"default": ProfileRunResult((chosen,))}, "default"), state
        )
    return out


def _decision_plugins() -> list[tuple[PluginSpec, Any]]:
    found = []
    for spec in in_tree_plugins():
        params = spec.parameters.model_validate(REQUIRED_PARAMETERS.get(spec.type, {}))
        plugin = spec.factory(spec.type, params, _Handle())
        if isinstance(plugin, Scorer | Filter | Picker):
            found.append((spec, params))
    return found


PLUGINS = _decision_plugins()


def _copies(spec: PluginSpec, params: Any, n: int) -> list[Any]:
    handle = _SharedRng()
    copies = [spec.factory(spec.type, params, handle) for _ in range(n)]
    if all(isinstance(c, Replicated) for c in copies):
        for i, copy in enumerate(copies):
            others = [c for c in copies if c is not copy]

            def publish(update: object, others: list[Any] = others, i: int = i) -> None:
                for other in others:
                    other.apply_update(update, i)

            copy.replicate(publish, i)
    return copies


@pytest.mark.parametrize(("spec", "params"), PLUGINS, ids=[spec.type for spec, _ in PLUGINS])
def test_a_plugin_that_keeps_nothing_per_worker_decides_alike_in_two_workers(
    spec: PluginSpec, params: Any
) -> None:
    [probe] = _copies(spec, params, 1)
    declared = spec.worker_state_of(params)
    if unshared_state(probe, declared):
        pytest.skip(f"declares per-worker state: {unshared_state(probe, declared)}")
    [alone] = _copies(spec, params, 1)
    one = [_decide(alone, request, ENDPOINTS) for request in REQUESTS]
    pair = _copies(spec, params, 2)
    two = [_decide(pair[i % 2], request, ENDPOINTS) for i, request in enumerate(REQUESTS)]
    assert two == one, (
        f"{spec.type}: its copies diverge under two workers, yet it declares no per-worker state"
    )
