"""An epick config as a fleet policy: sessions, refusals and adapters as the service would see them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from epick.config import load_config_text
from epick.framework import InferenceRequest, RequestBody
from epick.sim.engine import CostModel, EngineConfig
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import Fleet, Poisson
from epick.simulate.types import SimRequestSpec
from epick.simulate.workloads import build_workload

ENGINE = EngineConfig(num_gpu_blocks=2000, cost=CostModel())
HEADER = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def policy(body: str) -> EpickPolicy:
    return EpickPolicy("p", load_config_text(HEADER + body, seed=1))


def one_scorer(scorer: str, parameters: str = "") -> str:
    """A config body: one scorer of this type (with these YAML parameter lines) and max-score-picker."""
    params = f"  parameters:\n{parameters}" if parameters else ""
    return f"""
plugins:
- type: {scorer}
{params}- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: {scorer}
  - pluginRef: max-score-picker
"""


SESSION_ONLY = one_scorer("session-affinity-scorer")


def test_a_session_stays_on_the_server_its_token_names() -> None:
    """The simulated client sends back the x-session-token of its session's last response."""
    workload = build_workload("multi-turn", {"sessions": 12, "turns": 4, "think-time-s": 0.5})
    result = Fleet(6, ENGINE, policy(SESSION_ONLY)).run(
        workload.requests(random.Random(1)), Poisson(4.0), random.Random(2)
    )
    by_session: dict[str, set[int]] = {}
    for r in result.records:
        assert r.failed is None
        by_session.setdefault(r.request_id.rsplit("-", 1)[0], set()).add(r.server)
    assert len(by_session) == 12
    assert all(len(servers) == 1 for servers in by_session.values()), by_session
    # Without the token every turn is a tie broken at random: sessions would wander.
    assert len({next(iter(s)) for s in by_session.values()}) > 1


def test_a_request_no_endpoint_may_take_fails_with_the_reason() -> None:
    nothing = """
plugins:
- type: label-selector-filter
  parameters:
    matchLabels: {zone: mars}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: label-selector-filter
  - pluginRef: max-score-picker
"""
    specs = [SimRequestSpec(f"r{i}", "a b c", (1, 2, 3), 4) for i in range(5)]
    result = Fleet(2, ENGINE, policy(nothing)).run(specs, Poisson(10.0), random.Random(0))
    assert len(result.records) == 5
    assert all(r.failed and "refused by the scheduler" in r.failed for r in result.records)
    assert all("label-selector-filter" in (r.failed or "") for r in result.records)
    assert result.requests_per_server == [0, 0]


def test_a_trace_model_other_than_the_base_model_is_an_adapter(tmp_path: Path) -> None:
    """Adapters compete for LoRA slots whatever the workload: a trace names them in `model`."""
    lines = [
        {"arrival": i * 0.01, "prompt": "w " * 200, "output_tokens": 20, "model": f"lora-{i % 4}"}
        for i in range(40)
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    base = tmp_path / "base.jsonl"
    base.write_text("\n".join(json.dumps({**line, "model": "sim-model"}) for line in lines))
    engine = EngineConfig(num_gpu_blocks=2000, max_loras=1, cost=CostModel(lora_load_s=0.05))
    rr = HEADER + "plugins:\n- type: round-robin-picker\n"

    def makespan(trace: Path) -> float:
        fleet = Fleet(1, engine, policy(rr[len(HEADER) :]))
        specs = build_workload("trace", {"path": str(trace)}).requests(random.Random(0))
        result = fleet.run(specs, Poisson(1.0), random.Random(0))
        assert all(r.failed is None for r in result.records)
        return result.makespan

    assert makespan(path) > makespan(base) + 0.5  # four adapters take turns in one slot


TOKEN_LOAD = one_scorer("token-load-scorer", "    queueThresholdTokens: 20000\n")


def test_a_config_that_reads_only_prompt_lengths_never_spells_a_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request is the one the service would build; its text is spelt only when a plugin reads it
    (the token-load scorer reads the length, the prefix scorer the text)."""
    bodies: list[RequestBody] = []
    build = EpickPolicy.request

    def recording(self: EpickPolicy, spec: SimRequestSpec) -> InferenceRequest:
        request = build(self, spec)
        bodies.append(request.body)
        return request

    monkeypatch.setattr(EpickPolicy, "request", recording)
    workload = build_workload("sharegpt-like", {"n": 60})
    for config, spelt in ((TOKEN_LOAD, False), (one_scorer("prefix-cache-scorer"), True)):
        bodies.clear()
        result = Fleet(4, ENGINE, policy(config)).run(
            workload.requests(random.Random(3)), Poisson(30.0), random.Random(4)
        )
        assert len(bodies) == len(result.records) == 60
        assert {body.text_built for body in bodies} == {spelt}


SMALL = {
    "sharegpt-like": {"n": 30},
    "shared-prefix": {"groups": 3, "prompts-per-group": 10},
    "long-doc-qa": {"documents": 3, "questions-per-document": 10, "document-tokens": 2000},
    "lora-mix": {"n": 30},
    "multi-turn": {"sessions": 4},
}


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_the_length_given_without_the_text_is_the_texts_own(kind: str) -> None:
    p = policy(TOKEN_LOAD)
    workload = build_workload(kind, SMALL[kind])
    for spec in list(workload.requests(random.Random(5)))[:30]:
        lazy = p.request(spec).body
        assert lazy.prefix_bytes == len(spec.prompt.encode()) and not lazy.text_built
        assert lazy.prefix_text == spec.prompt and lazy.text_built
