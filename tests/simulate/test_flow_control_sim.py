"""Flow control in the fleet simulator, in virtual time: the service's own controller holds what the
pool has no room for and dispatches it by priority; every request is still accounted for exactly
once, and tenants and priorities come from any workload's parameters."""

from __future__ import annotations

import random

import pytest

from epick.config import load_config_text
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import Fleet, Poisson
from epick.simulate.report import SLO, jain, summarize
from epick.simulate.workloads.base import WorkloadError
from epick.simulate.workloads.registry import build_workload
from tests.simulate.test_fleet import ENGINE

FLOW = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: max-score-picker
- type: round-robin-fairness-policy
- type: concurrency-detector
  parameters: {{maxConcurrency: 4, concurrencyMode: requests}}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
flowControl:
  defaultRequestTTL: {ttl}
  saturationDetector: {{pluginRef: concurrency-detector}}
  defaultPriorityBand: {{fairnessPolicyRef: round-robin-fairness-policy}}
  priorityBands:
  - {{priority: 10, fairnessPolicyRef: round-robin-fairness-policy}}
  - {{priority: -10, fairnessPolicyRef: round-robin-fairness-policy}}
"""


def run(ttl: str = "60s", qps: float = 200.0, n: int = 300) -> tuple[EpickPolicy, dict[str, object], int]:
    policy = EpickPolicy("fc", load_config_text(FLOW.format(ttl=ttl), seed=1))
    workload = build_workload("sharegpt-like", {"tenants": "3", "priorities": "10:0.3,-10:0.7", "n": str(n)})
    result = Fleet(2, ENGINE, policy).run(workload.requests(random.Random(1)), Poisson(qps), random.Random(1))
    assert len(result.records) == n and len({r.request_id for r in result.records}) == n
    assert all(r.finish is not None for r in result.records)  # finished or failed, every one
    return policy, summarize("fc", qps, result, SLO()), max(r.server for r in result.records)


def test_an_overloaded_fleet_serves_the_high_band_first() -> None:
    policy, summary, _ = run(ttl="1h")
    assert policy.flow is not None and policy.flow.queued == 0
    by_priority = summary["by_priority"]
    assert isinstance(by_priority, dict)
    assert set(by_priority) == {"10", "-10"}
    assert summary["failed"] == 0  # a long budget: everything waits its turn
    assert by_priority["10"]["ttft_s"]["p90"] < by_priority["-10"]["ttft_s"]["p90"]


def test_a_short_budget_expires_requests_and_counts_them_failed() -> None:
    _, summary, _ = run(ttl="50ms")
    reasons = summary["failure_reasons"]
    assert isinstance(reasons, list) and reasons
    assert all("refused by flow control: request timed out in queue" in r["reason"] for r in reasons)
    assert summary["by_priority"]["-10"]["completion"] < summary["by_priority"]["10"]["completion"]  # type: ignore[index]


def test_the_same_seed_gives_the_same_run() -> None:
    assert run(n=120)[1] == run(n=120)[1]


def test_tenancy_keeps_a_sessions_tenant_and_leaves_the_requests_alone() -> None:
    plain = list(build_workload("multi-turn", {"sessions": "20"}).requests(random.Random(3)))
    tagged = list(
        build_workload(
            "multi-turn", {"sessions": "20", "tenants": "4", "tenant-weights": "4,1,1,1"}
        ).requests(random.Random(3))
    )
    assert [(s.request_id, tuple(s.tokens)) for s in plain] == [
        (s.request_id, tuple(s.tokens)) for s in tagged
    ]
    by_session: dict[str | None, set[str]] = {}
    for spec in tagged:
        by_session.setdefault(spec.session, set()).add(spec.tenant)
    assert all(len(tenants) == 1 for tenants in by_session.values())
    assert {s.tenant for s in tagged} <= {"t0", "t1", "t2", "t3"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"tenants": "0"}, "tenants must be at least 1"),
        ({"tenants": "2", "tenant-weights": "1"}, "needs 2 positive numbers"),
        ({"priorities": "high:0.5"}, "PRIORITY:SHARE"),
        ({"priorities": "1:0,2:0"}, "must not all be 0"),
    ],
)
def test_bad_tenancy_parameters_are_named(params: dict[str, str], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        build_workload("sharegpt-like", params)


def test_jain() -> None:
    assert jain([0.25] * 4) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25
