"""`epick simulate` agrees with the same workload sent in real time through `epick serve` to
`epick sim-server`s: the same engine model behind both, so the same ordering of policies and
close prefix-cache hit rates."""

from __future__ import annotations

import random
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epick.config import LoadedConfig, load_config_file, load_default_config
from epick.datalayer.datastore import EndpointSpec
from epick.proxy.server import ProxyOptions
from epick.service import Service, Settings
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import ClosedLoop, Fleet
from epick.simulate.types import SimRequestSpec
from epick.simulate.workloads import SharedPrefix

CONFIGS = Path(__file__).resolve().parents[2] / "config"
WORKLOAD = SharedPrefix(groups=6, prompts_per_group=4, system_tokens=400, question_tokens=30, output_tokens=4)
ENGINE = ServerOptions.engine_config(num_gpu_blocks=300)  # ~2 groups' prefixes per server: eviction matters


def configs() -> dict[str, LoadedConfig]:
    return {
        "default": load_default_config(seed=5),
        "round-robin": load_config_file(CONFIGS / "round-robin.yaml", seed=5),
    }


def specs() -> list[SimRequestSpec]:
    return list(WORKLOAD.requests(random.Random(11)))


def simulated_hit_rate(config: LoadedConfig) -> float:
    result = Fleet(3, ENGINE, EpickPolicy("p", config)).run(specs(), ClosedLoop(1), random.Random(0))
    assert all(r.failed is None for r in result.records)
    return result.prefix_hits / result.prefix_queries


async def served_hit_rate(config: LoadedConfig) -> float:
    sims = [SimServer(ServerOptions(port=0, time_scale=200, engine=ENGINE), i) for i in range(3)]
    for s in sims:
        await s.start()
    endpoints = tuple(EndpointSpec(f"s{i}", "127.0.0.1", s.port, {}) for i, s in enumerate(sims))
    options = Settings(
        endpoints=endpoints, proxy=ProxyOptions(host="127.0.0.1", port=0), metrics_port=None,
        refresh_metrics_interval=0.02,
    )  # fmt: skip
    service = Service(options, config)
    await service.start()
    hits = queries = 0.0
    try:
        assert service.proxy is not None
        url = f"http://127.0.0.1:{service.proxy.port}/v1/completions"
        async with aiohttp.ClientSession() as session:
            for spec in specs():  # one at a time, as the closed loop of one above
                body = {"model": "sim-model", "prompt": spec.prompt, "max_tokens": spec.output_tokens}
                async with session.post(url, json=body) as r:
                    assert r.status == 200, await r.text()
            for s in sims:
                async with session.get(s.url + "/metrics") as r:
                    for family in text_string_to_metric_families(await r.text()):
                        for sample in family.samples:
                            if sample.name == "vllm:prefix_cache_hits_total":
                                hits += sample.value
                            elif sample.name == "vllm:prefix_cache_queries_total":
                                queries += sample.value
    finally:
        await service.stop()
        for s in sims:
            await s.stop()
    return hits / queries


@pytest.mark.parametrize("name", ["default", "round-robin"])
async def test_hit_rates_agree(name: str) -> None:
    simulated = simulated_hit_rate(configs()[name])
    served = await served_hit_rate(configs()[name])
    # The sim-server tokenizes the text itself: each generated word is one of its tokens as well, and
    # a completion adds no template, so both engines see the same blocks (here the rates are equal).
    assert served == pytest.approx(simulated, abs=0.05)


async def test_same_ordering_of_policies() -> None:
    sim = {name: simulated_hit_rate(c) for name, c in configs().items()}
    served = {name: await served_hit_rate(c) for name, c in configs().items()}
    assert (sim["default"] > sim["round-robin"]) and (served["default"] > served["round-robin"])
