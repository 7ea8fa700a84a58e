"""The predicted-latency config as users run it, through the proxy: simulated vLLM servers, streamed
requests, clients sending garbage latency objectives. Every request is served, and the predictor
learns a TTFT and a TPOT from each streamed response."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from epick.config import load_config_file
from epick.plugins.latency.producer import PredictedLatencyProducer
from epick.sim.server import ServerOptions, SimServer
from tests.datalayer.pages import wait_until
from tests.proxy.conftest import MakeService, proxy_url

CONFIG = Path(__file__).parents[2] / "config" / "predicted-latency.yaml"
HOSTILE = ["nan", "-5", "1e309", "fast", "", "0x10", "9" * 400]


async def test_streamed_requests_with_hostile_objectives_are_served_and_train_the_predictor(
    make_service: MakeService,
) -> None:
    sims = [SimServer(ServerOptions(port=0, time_scale=100), i) for i in range(2)]
    for s in sims:
        await s.start()
    try:
        config = load_config_file(CONFIG, seed=0)
        service = await make_service([f"127.0.0.1:{s.port}" for s in sims], config)
        producer = next(p for p in config.plugins.values() if isinstance(p, PredictedLatencyProducer))
        async with aiohttp.ClientSession() as http:
            for i, bad in enumerate(HOSTILE):
                body = {"model": "sim-model", "messages": [{"role": "user", "content": f"hello {i}"}],
                        "max_tokens": 5, "stream": True}  # fmt: skip
                headers = {"x-llm-d-slo-ttft-ms": bad, "x-slo-tpot-ms": bad}
                async with http.post(
                    proxy_url(service) + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    assert r.status == 200, await r.text()
                    events = [line async for line in r.content if line.startswith(b"data: ")]
                assert events[-1].strip() == b"data: [DONE]"
                assert json.loads(events[0][6:])["choices"]
        n = len(HOSTILE)
        await wait_until(lambda: producer.tpot_accuracy.responses == n, what="every response learned from")
        assert producer.ttft_accuracy.responses == n
        assert producer.ttft_accuracy.objective_misses == 0  # garbage objectives count as none
        assert sum(producer.dispatched(ep.name) for ep in service.datastore.all_endpoints()) == 0
    finally:
        for s in sims:
            await s.stop()
