"""`epick serve` following a pool's InferenceObjective resources: the priority a request gets from the
objective it names follows the cluster (both API groups, changes, deletions, invalid versions), over
the --objective flags, and flow control keeps a band for each objective's priority."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from epick.datalayer.objectives import ObjectiveError, parse_objective
from epick.service import Service
from epick.sim.server import SimServer
from tests.kubernetes.fake_apiserver import REWRITES_LLMD, FakeApiServer
from tests.kubernetes.test_rewrites import sim, start_service
from tests.kubernetes.test_serve import wait_for

__all__ = ["sim"]  # the fixture

BODY = json.dumps({"model": "sim-model", "prompt": "hi"}).encode()
FLOW = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
"""


def spec(pool: str, priority: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"poolRef": {"name": pool}}
    if priority is not None:
        out["priority"] = priority
    return out


def priority_of(service: Service, objective: str, header: str = "x-gateway-inference-objective") -> int:
    request = service.director.parse(BODY, {header: objective}).request
    return request.priority


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


async def test_request_priorities_follow_the_pools_objectives(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path
) -> None:
    fake.put_objective("interactive", spec("pool", 10))
    fake.put_objective("elsewhere", spec("other-pool", 99))
    fake.put_objective("unset", spec("pool"))
    service = await start_service(fake, sim, tmp_path, objectives=(("batch", -5), ("interactive", 1)))
    try:
        assert priority_of(service, "interactive") == 10  # the cluster wins over the flag
        assert priority_of(service, "interactive", "x-llm-d-inference-objective") == 10
        assert priority_of(service, "batch") == -5  # the flag
        assert priority_of(service, "unset") == 0 and priority_of(service, "elsewhere") == 0
        fake.put_objective("bulk", spec("pool", -10), api=REWRITES_LLMD)
        await wait_for(lambda: priority_of(service, "bulk") == -10)
        fake.put_objective("interactive", spec("pool", 20))
        await wait_for(lambda: priority_of(service, "interactive") == 20)
        fake.delete_objective("interactive")
        await wait_for(lambda: priority_of(service, "interactive") == 1)  # back to the flag
    finally:
        await service.stop()


async def test_an_invalid_objective_keeps_its_last_valid_version(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put_objective("o", spec("pool", 3))
    service = await start_service(fake, sim, tmp_path)
    try:
        with caplog.at_level(logging.ERROR):
            fake.put_objective("o", spec("pool", "high"))
            await wait_for(lambda: "spec.priority must be an integer" in caplog.text)
        assert "last valid version stays in force" in caplog.text
        assert priority_of(service, "o") == 3
    finally:
        await service.stop()


async def test_flow_control_keeps_a_band_for_each_objectives_priority(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path
) -> None:
    fake.put_objective("interactive", spec("pool", 10))
    fake.put_objective("batch", spec("pool", -3))
    config = tmp_path / "flow.yaml"
    config.write_text(FLOW)
    svc = await start_service(fake, sim, tmp_path, config_file=str(config))
    try:
        admission = svc.director.admission
        assert admission is not None
        await wait_for(lambda: admission.controller.registry.priorities == [10, 0, -3])
        fake.put_objective("urgent", spec("pool", 50))
        await wait_for(lambda: 50 in admission.controller.registry.priorities)
    finally:
        await svc.stop()


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"kind": "InferenceObjective", "apiVersion": "v1", "metadata": {"name": "x"}}, "apiVersion"),
        (
            {
                "kind": "InferenceObjective",
                "apiVersion": "llm-d.ai/v1alpha2",
                "metadata": {"name": "x"},
                "spec": {},
            },
            "spec.poolRef.name is required",
        ),
        (
            {
                "kind": "InferenceObjective",
                "apiVersion": "llm-d.ai/v1alpha2",
                "metadata": {"name": "x"},
                "spec": {"poolRef": {"name": "p"}, "priority": True},
            },
            "spec.priority must be an integer",
        ),
    ],
)
def test_bad_objectives_are_named(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ObjectiveError, match=message):
        parse_objective(obj, "f.yaml")
