"""The predicted-latency config through a real Envoy in the modes GIE's gateways configure (request
and response bodies FULL_DUPLEX_STREAMED): streamed responses reach the producer chunk by chunk, so it
learns each TTFT and TPOT, and garbage objectives from the client change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from epick.config import load_config_file
from epick.plugins.latency.producer import PredictedLatencyProducer
from tests.extproc.gateway import Modes, running_gateway

CONFIG = Path(__file__).parents[2] / "config" / "predicted-latency.yaml"


async def test_full_duplex_streams_train_the_predictor(tmp_path: Path) -> None:
    config = load_config_file(CONFIG, seed=0)
    producer = next(p for p in config.plugins.values() if isinstance(p, PredictedLatencyProducer))
    ids = {f"s{i}" for i in range(4)}
    async with running_gateway(tmp_path, Modes(), config=config) as gateway:
        async with aiohttp.ClientSession() as session:
            for request_id in sorted(ids):
                body = {"model": "sim-model", "messages": [{"role": "user", "content": request_id}],
                        "max_tokens": 6, "stream": True}  # fmt: skip
                headers = {
                    "x-request-id": request_id,
                    "x-llm-d-slo-ttft-ms": "nan",
                    "x-llm-d-slo-tpot-ms": "-1",
                }
                async with session.post(
                    gateway.url + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    assert r.status == 200, await r.text()
                    events = [line async for line in r.content if line.startswith(b"data: ")]
                assert events[-1].strip() == b"data: [DONE]"
                assert json.loads(events[0][6:])["choices"] is not None
        await gateway.wait_completed(ids)
    assert producer.ttft_accuracy.responses == 4 and producer.tpot_accuracy.responses == 4
    assert producer.ttft_accuracy.objective_misses == producer.tpot_accuracy.objective_misses == 0
