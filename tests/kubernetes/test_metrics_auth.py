"""/metrics behind TokenReview and SubjectAccessReview, as the Go EPP's controller-runtime filter, and
over TLS: against the API double, with the real kubernetes-asyncio client."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from epick.service.metrics_server import MetricsAuth, MetricsServer, metrics_tls
from tests.kubernetes.fake_apiserver import FakeApiServer

SA = "system:serviceaccount:llm-d:vllm-qwen3-32b-epp"


@pytest.fixture(autouse=True)
def _reviews(fake: FakeApiServer) -> None:
    """The double knows two tokens, and lets one of them read /metrics."""
    fake.tokens = {"good": (SA, ["system:serviceaccounts"]), "other": ("someone", [])}
    fake.allowed = {(SA, "/metrics", "get")}


async def serving(auth: MetricsAuth | None, tls: ssl.SSLContext | None = None) -> MetricsServer:
    server = MetricsServer(lambda: b"llm_d_epp_info 1.0\n", "text/plain", auth=auth, tls=tls)
    await server.start("127.0.0.1", 0)
    return server


async def get(port: int, token: str | None, scheme: str = "http", **kw: Any) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    url = f"{scheme}://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers, **kw) as r:
        return r.status, await r.text()


async def test_a_token_the_api_server_knows_and_authorizes_reads_the_metrics(
    fake: FakeApiServer, api: Any
) -> None:
    server = await serving(MetricsAuth(lambda: api))
    try:
        assert await get(server.port, "good") == (200, "llm_d_epp_info 1.0\n")
        assert await get(server.port, None) == (401, "Unauthorized\n")
        assert await get(server.port, "forged") == (500, "Authentication failed\n")
        assert await get(server.port, "other") == (403, "Authorization denied for user someone\n")
        # the reviews asked, as controller-runtime asks them
        sar = next(r for r in fake.reviews if r["kind"] == "SubjectAccessReview")
        assert sar["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        assert sar["spec"]["user"] == SA and "system:authenticated" in sar["spec"]["groups"]
        # cached: a second read asks nothing more
        asked = len(fake.reviews)
        assert (await get(server.port, "good"))[0] == 200
        assert len(fake.reviews) == asked
    finally:
        await server.stop()


async def test_without_an_api_server_the_metrics_are_refused(tmp_path: Path) -> None:
    server = await serving(MetricsAuth(lambda: None))
    try:
        assert await get(server.port, "good") == (500, "Authentication failed\n")
    finally:
        await server.stop()


async def test_metrics_over_tls_with_a_client_certificate(
    tmp_path: Path, fake: FakeApiServer, api: Any
) -> None:
    from tests.extproc.test_tls import CA, SecretDir

    ca = CA("metrics-ca")
    secret = SecretDir(tmp_path / "certs", ca.issue())
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(ca.pem)
    server = await serving(MetricsAuth(lambda: api), metrics_tls(str(secret.path), str(client_ca)))
    try:
        context = ssl.create_default_context(cadata=ca.pem.decode())
        context.check_hostname = False
        pair = ca.issue("prometheus", client=True)
        cert, key = tmp_path / "c.crt", tmp_path / "c.key"
        cert.write_bytes(pair.cert)
        key.write_bytes(pair.key)
        context.load_cert_chain(cert, key)
        assert await get(server.port, "good", "https", ssl=context) == (200, "llm_d_epp_info 1.0\n")
        anonymous = ssl.create_default_context(cadata=ca.pem.decode())
        anonymous.check_hostname = False
        with pytest.raises(aiohttp.ClientError):
            await get(server.port, "good", "https", ssl=anonymous)
    finally:
        await server.stop()


async def test_the_answers_kept_are_bounded_and_one_review_is_asked_per_key() -> None:
    import asyncio

    from epick.service import metrics_server

    answers = metrics_server._Answers(lambda: 0.0)
    asked: list[str] = []

    async def review(key: str) -> tuple[str, float]:
        asked.append(key)
        await asyncio.sleep(0)
        return key.upper(), 60.0

    found = await asyncio.gather(*(answers.get("same", lambda: review("same")) for _ in range(5)))
    assert found == ["SAME"] * 5 and asked == ["same"]  # five waiting, one review
    for i in range(metrics_server.CACHE_ENTRIES + 100):
        await answers.get(f"t{i}", lambda i=i: review(f"t{i}"))  # type: ignore[misc]
    assert len(answers._kept) <= metrics_server.CACHE_ENTRIES
