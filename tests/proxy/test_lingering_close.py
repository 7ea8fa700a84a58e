"""A body over the limit is answered 413 while the client is still sending it; a client that writes the
whole body before it reads (Python's urllib) gets the 413, not a connection reset: the connection
closes lingeringly (RFC 9112, section 9.6)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from tests.proxy.conftest import MakeService, proxy_url


def post(url: str, size: int) -> int:
    request = urllib.request.Request(url, data=b"x" * size, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


async def test_a_client_that_writes_its_whole_body_first_reads_the_413(
    make_fake: object, make_service: MakeService
) -> None:
    fake = await make_fake("echo")  # type: ignore[operator]
    service = await make_service([fake.name], max_body_bytes=1 << 20)
    url = f"{proxy_url(service)}/v1/completions"
    for _ in range(3):
        assert await asyncio.to_thread(post, url, 8 << 20) == 413
