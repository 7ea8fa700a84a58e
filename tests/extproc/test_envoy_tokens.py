"""A token producer that asks the model server for tokens, behind a real Envoy: the ext_proc stream
waits for the tokenize call, and the precise producer then has the tokens to look up."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from epick.config import load_config_text
from epick.plugins.prefix.precise import PrecisePrefixCacheProducer
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer
from tests.extproc.gateway import running_gateway
from tests.extproc.test_envoy import GIE

TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "tokenizer"


async def test_tokens_from_the_model_servers_tokenize_before_routing(tmp_path: Path) -> None:
    sim = SimServer(ServerOptions(port=0, time_scale=100, tokenizer=str(TOKENIZER)))
    await sim.start()
    try:
        config = load_config_text(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
            f"- type: token-producer\n  parameters: {{vllm: {{url: 'http://127.0.0.1:{sim.port}'}}}}\n"
            "- type: precise-prefix-cache-producer\n"
            "- type: prefix-cache-scorer\n"
            "  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}\n"
        )
        producer = config.plugins["precise-prefix-cache-producer"]
        assert isinstance(producer, PrecisePrefixCacheProducer)
        async with running_gateway(tmp_path, GIE, backends=[("127.0.0.1", sim.port)], config=config) as gw:
            content = "Explain the prefix cache of a model server in two sentences. " * 4
            body = {
                "model": sim.options.model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 2,
            }
            async with (
                aiohttp.ClientSession() as session,
                session.post(gw.url + "/v1/chat/completions", json=body) as r,
            ):
                assert r.status == 200, await r.text()
            # The producer looked up the prompt's blocks: it had the server's tokens.
            assert producer.lookups == 1
            assert gw.service.director.tokenization.failures == 0
    finally:
        await sim.stop()
