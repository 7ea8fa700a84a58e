"""The precise guide's pod, as llm-d deploys it: `token-producer` asks the tokenizer sidecar on a
Unix socket (`udsTokenizerConfig`), the precise prefix producer hears the engines' KV events, and a
prompt goes to the engine that holds its prefix. Not ready until the sidecar has answered."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from epick.config import load_config_text
from epick.datalayer.datastore import EndpointSpec
from epick.proxy.server import ENDPOINT_HEADER, ProxyOptions
from epick.service import Service, Settings
from epick.sim.tokenizing import load as load_sim_tokenizer
from epick.sim.uds_tokenizer import TokenizerSidecar
from tests.datalayer.pages import start_sim, stop_sim
from tests.proxy.test_precise_replicas import (
    MODEL,
    SYSTEM,
    TOKENIZER,
    config_text,
    free_consecutive_ports,
    until,
)


async def test_tokens_from_the_sidecar_route_a_prompt_to_its_holder(tmp_path: Path) -> None:
    socket_path = tmp_path / "tokenizer" / "tokenizer-uds.socket"
    base = free_consecutive_ports(2)
    # One pod's two ranks: rank i (its i-th port, in order) publishes on base + i, as data-parallel vLLM.
    ports = sorted(free_consecutive_ports(1) for _ in range(2))
    sims = [
        await start_sim(port=port, tokenizer=str(TOKENIZER), kv_events_endpoint=f"tcp://127.0.0.1:{base + i}")
        for i, port in enumerate(ports)
    ]
    config = config_text(base).replace(
        f"  parameters: {{local: {{path: {TOKENIZER}}}}}\n",
        f"  parameters: {{modelName: {MODEL}, udsTokenizerConfig: {{socketFile: {socket_path}}}}}\n",
    )
    specs = tuple(EndpointSpec(f"127.0.0.1:{s.port}", "127.0.0.1", s.port, {}, pod_name="sims") for s in sims)
    settings = Settings(
        endpoints=specs,
        proxy=ProxyOptions(host="127.0.0.1", port=0, expose_endpoint=True),
        metrics_port=None,
        refresh_metrics_interval=0.02,
    )
    service = Service(settings, load_config_text(config, seed=1))
    sidecar = TokenizerSidecar(load_sim_tokenizer(str(TOKENIZER)), str(socket_path))
    await service.start()
    try:
        assert not service.health.ready
        assert "tokenizer sidecar" in (service.health.why_not_ready() or "")
        await sidecar.start()
        await until(lambda: service.health.ready, "readiness once the sidecar answers")
        assert sidecar.initialized == [MODEL]
        producer = service.director.config.plugins["precise-prefix-cache-producer"]
        pods = [f"127.0.0.1:{s.port}" for s in sims]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

            async def direct(port: int, content: str) -> None:
                body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
                async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()

            for n, pod in enumerate(pods):
                await until(
                    lambda pod=pod: producer.index.blocks_by_pod().get(pod, 0) > 0,  # type: ignore[attr-defined]
                    f"hearing {pod}",
                    lambda n=n: direct(sims[n].port, f"warm-up {n}: " + "tokens " * 40),
                )
            await direct(sims[-1].port, SYSTEM + "First question?")  # behind the router's back
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": SYSTEM + "Another?"}],
                "max_tokens": 2,
            }
            assert service.proxy is not None
            url = f"http://127.0.0.1:{service.proxy.port}/v1/chat/completions"
            for _ in range(2):
                async with http.post(url, json=body) as r:
                    assert r.status == 200, await r.text()
                    assert r.headers[ENDPOINT_HEADER] == pods[-1]
        assert service.director.tokenization.failures == 0
        assert sidecar.calls  # the tokens came from it
    finally:
        await service.stop()
        await sidecar.stop()
        for sim in sims:
            await stop_sim(sim)
