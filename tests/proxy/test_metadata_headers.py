"""The standalone proxy's stand-in for ext_proc dynamic metadata: what request-attribute-reporter
reports goes back as a response header when the proxy reads the response whole; a streamed response's
headers are gone before its usage is known, so it carries none."""

from __future__ import annotations

import aiohttp

from epick.config import LoadedConfig, load_config_text
from epick.plugins import in_tree_registry
from tests.conftest import MakeSim
from tests.proxy.conftest import MODEL, SEED, MakeService, proxy_url

KEY = "x-gateway-inference-request-cost"


def reporting_config() -> LoadedConfig:
    registry = in_tree_registry()
    return load_config_text(
        f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: cost
  type: request-attribute-reporter
  parameters:
    attributes:
    - key: {{name: {KEY}}}
      expression: usage.prompt_tokens + usage.completion_tokens
""",
        registry=registry,
        seed=SEED,
    )


async def test_a_whole_response_carries_the_reported_value_as_a_header(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    sim = await make_sim(time_scale=1000.0)
    service = await make_service([f"127.0.0.1:{sim.port}"], reporting_config())
    request = {"model": MODEL, "prompt": "Say something.", "max_tokens": 5}
    async with http.post(proxy_url(service) + "/v1/completions", json=request) as answer:
        assert answer.status == 200
        usage = (await answer.json())["usage"]
        assert answer.headers[KEY] == str(usage["prompt_tokens"] + usage["completion_tokens"])


async def test_a_streamed_response_carries_no_header(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    sim = await make_sim(time_scale=1000.0)
    service = await make_service([f"127.0.0.1:{sim.port}"], reporting_config())
    request = {
        "model": MODEL,
        "prompt": "Say something.",
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(proxy_url(service) + "/v1/completions", json=request) as answer:
        assert answer.status == 200
        body = await answer.read()
        assert b'"usage"' in body
        assert KEY not in answer.headers


async def test_without_the_reporter_there_is_no_header(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    sim = await make_sim(time_scale=1000.0)
    service = await make_service([f"127.0.0.1:{sim.port}"])
    request = {"model": MODEL, "prompt": "Say something.", "max_tokens": 5}
    async with http.post(proxy_url(service) + "/v1/completions", json=request) as answer:
        assert answer.status == 200 and KEY not in answer.headers
