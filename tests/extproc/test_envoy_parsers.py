"""The parsers through a real Envoy: every path a configured parser claims reaches the model server
epick chose, with its path and body unchanged; a path no parser claims is answered by epick (404,
naming the accepted paths) and reaches no model server."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from yarl import URL

from tests.conftest import MakeApp
from tests.extproc.gateway import running_gateway
from tests.extproc.test_envoy import GIE
from tests.proxy.test_parser_paths import EVERY_PARSER, SERVED, Backend, parsers_config


async def started(make_app: MakeApp) -> Backend:
    backend = Backend()
    backend.server = await make_app(backend.app())
    return backend


async def test_every_parsers_paths_through_envoy(tmp_path: Path, make_app: MakeApp) -> None:
    backend = await started(make_app)
    host, port = backend.name.rsplit(":", 1)
    config = parsers_config(*EVERY_PARSER)
    async with (
        running_gateway(tmp_path, GIE, backends=[(host, int(port))], config=config) as gateway,
        aiohttp.ClientSession() as session,
    ):
        for path, raw in SERVED:
            url = URL(gateway.url + path, encoded=True)
            async with session.post(url, data=raw, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, (path, await r.text())
                assert await r.json() == {"ok": True}
            seen = backend.requests[-1]
            assert (seen.path, seen.body) == (path, raw)
        assert len(backend.requests) == len(SERVED)
        # Every request was decided by epick, with the parser its path names.
        assert len(gateway.decisions) == len(SERVED)


async def test_an_unclaimed_path_is_refused_by_epick_through_envoy(tmp_path: Path, make_app: MakeApp) -> None:
    backend = await started(make_app)
    host, port = backend.name.rsplit(":", 1)
    config = parsers_config("openai-parser", "anthropic-parser")
    async with (
        running_gateway(tmp_path, GIE, backends=[(host, int(port))], config=config) as gateway,
        aiohttp.ClientSession() as session,
    ):
        async with session.post(gateway.url + "/v1/rerank", data=b'{"model": "m"}') as r:
            assert r.status == 404
            error = json.loads(await r.read())["error"]
        assert error["code"] == "path_not_served"
        assert "/chat/completions" in error["message"] and "/messages" in error["message"]
        assert backend.requests == []
