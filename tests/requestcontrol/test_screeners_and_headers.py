"""The request path's order before scheduling: request-header processors, admission, screeners (the
candidates every one keeps), data producers, admitters — as upstream's director runs them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from epick.config import load_config_text
from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins import in_tree_registry
from epick.plugins.registry import Handle, Parameters, PluginSpec
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

SEEN: list[str] = []


class KeepParameters(Parameters):
    keep: list[str] = []


class KeepScreener(NamedPlugin):
    plugin_type = "keep-screener"
    reads = Reads.NOTHING

    def __init__(self, name: str, keep: list[str]) -> None:
        super().__init__(name)
        self.keep = keep

    def process_request_headers(self, request: InferenceRequest, cycle_state: CycleState) -> None:
        SEEN.append(f"headers:{self.name}")

    def screen(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        SEEN.append(f"screen:{self.name}")
        return [ep for ep in endpoints if ep.name in self.keep]

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        SEEN.append(f"produce:{self.name}:{','.join(ep.name for ep in endpoints)}")


def _factory(name: str, params: KeepParameters, handle: Handle) -> KeepScreener:
    return KeepScreener(name, params.keep)


def path_with(*keeps: list[str]) -> RequestPath:
    registry = in_tree_registry()
    registry.register(PluginSpec("keep-screener", _factory, KeepParameters))
    plugins = "".join(
        f"- name: s{i}\n  type: keep-screener\n  parameters: {{keep: {k}}}\n" for i, k in enumerate(keeps)
    )
    text = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        + plugins
        + "- type: queue-scorer\n"
    )
    return RequestPath(load_config_text(text, registry=registry, seed=0))


def test_the_request_keeps_what_every_screener_kept_and_producers_see_only_that() -> None:
    SEEN.clear()
    eps = tuple(make_endpoint(n) for n in ("a", "b", "c"))
    result = path_with(["a", "b"], ["b", "c"]).decide(make_request(), eps)
    assert [ep.name for ep in result.targets] == ["b"]
    assert SEEN == ["headers:s0", "headers:s1", "screen:s0", "screen:s1", "produce:s0:b", "produce:s1:b"]


def test_no_endpoint_left_by_the_screeners_is_503() -> None:
    eps = tuple(make_endpoint(n) for n in ("a", "b"))
    with pytest.raises(RequestError) as info:
        path_with(["a"], ["b"]).decide(make_request(), eps)
    assert (info.value.status, info.value.code) == (503, "screened_out")
