"""MetricsClient: the scrapers' keep-alive HTTP/1.1 GET, against raw servers that answer as told."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from epick.datalayer.http import HTTPError, MetricsClient
from tests.datalayer.pages import free_port, wait_until

Answer = Callable[[int], bytes]  # the n-th request on a connection (from 0) -> the raw response


class RawServer:
    """Answers each request with `answer(n)`; counts connections; closes after an answer that says so."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                try:
                    self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                except asyncio.IncompleteReadError:
                    break
                raw = self.answer(n)
                n += 1
                writer.write(raw)
                await writer.drain()
                head = raw.split(b"\r\n\r\n", 1)[0]
                framed = b"Content-Length" in head or b"chunked" in head
                if b"Connection: close" in head or not framed:
                    break
        finally:
            writer.close()


StartRaw = Callable[[Answer], Awaitable[RawServer]]


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Answer], Awaitable[RawServer]]]:
    servers: list[RawServer] = []

    async def start(answer: Answer) -> RawServer:
        server = await RawServer(answer).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def clients() -> AsyncIterator[list[MetricsClient]]:
    made: list[MetricsClient] = []
    yield made
    for client in made:
        client.close()


@pytest.fixture(params=[None, 0.005, 0.0], ids=["as-it-comes", "gathered", "gathered-at-once"])
def gather(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs with answers read as they come, and gathered (5 ms after the GET, and at the
    next turn of the loop, which often finds an answer not yet whole)."""
    original = MetricsClient.__init__

    def init(self: MetricsClient, *args: object, **kw: object) -> None:
        kw.setdefault("gather_after", request.param)
        original(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(MetricsClient, "__init__", init)


def with_length(body: str, extra: str = "") -> bytes:
    data = body.encode()
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\n{extra}\r\n".encode() + data


def chunked(*parts: str) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for part in parts:
        data = part.encode()
        out += f"{len(data):x}\r\n".encode() + data + b"\r\n"
    return out + b"0\r\n\r\n"


@pytest.mark.usefixtures("gather")
async def test_keep_alive_with_content_length(raw_server: StartRaw, clients: list[MetricsClient]) -> None:
    server = await raw_server(lambda n: with_length(f"page {n}"))
    client = MetricsClient("127.0.0.1", server.port, "/metrics", 1.0)
    clients.append(client)
    assert [await client.get() for _ in range(5)] == [(200, f"page {n}") for n in range(5)]
    assert server.connections == 1
    request = server.requests[0].decode()
    assert request.startswith("GET /metrics HTTP/1.1\r\n") and f"Host: 127.0.0.1:{server.port}" in request


@pytest.mark.usefixtures("gather")
async def test_chunked_body(raw_server: StartRaw, clients: list[MetricsClient]) -> None:
    server = await raw_server(lambda n: chunked("vllm:num_requests_waiting ", f"{n}\n", "é"))
    client = MetricsClient("127.0.0.1", server.port, "/metrics", 1.0)
    clients.append(client)
    assert await client.get() == (200, "vllm:num_requests_waiting 0\né")
    assert await client.get() == (200, "vllm:num_requests_waiting 1\né")
    assert server.connections == 1


@pytest.mark.usefixtures("gather")
async def test_connection_close_and_close_delimited_bodies_reconnect(
    raw_server: StartRaw, clients: list[MetricsClient]
) -> None:
    answers = [
        with_length("a", "Connection: close\r\n"),
        b"HTTP/1.0 200 OK\r\n\r\nuntil the end",  # no length: the body ends when the connection does
        with_length("c"),
    ]
    server = await raw_server(lambda n: answers[min(server.connections - 1, 2)])
    client = MetricsClient("127.0.0.1", server.port, "/metrics", 1.0)
    clients.append(client)
    assert await client.get() == (200, "a")
    assert await client.get() == (200, "until the end")
    assert await client.get() == (200, "c")
    assert server.connections == 3


@pytest.mark.usefixtures("gather")
async def test_status_is_returned(raw_server: StartRaw, clients: list[MetricsClient]) -> None:
    server = await raw_server(lambda n: b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
    client = MetricsClient("127.0.0.1", server.port, "/metrics", 1.0)
    clients.append(client)
    assert await client.get() == (503, "busy")


@pytest.mark.usefixtures("gather")
async def test_not_http_is_an_http_error(raw_server: StartRaw, clients: list[MetricsClient]) -> None:
    server = await raw_server(lambda n: b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    client = MetricsClient("127.0.0.1", server.port, "/metrics", 1.0)
    clients.append(client)
    with pytest.raises(HTTPError, match=re.escape("not an HTTP/1.x response: 'SSH-2.0-OpenSSH_9.6'")):
        await client.get()


@pytest.mark.usefixtures("gather")
async def test_silence_is_a_timeout(raw_server: StartRaw, clients: list[MetricsClient]) -> None:
    server = await raw_server(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
    client = MetricsClient("127.0.0.1", server.port, "/metrics", 0.2)
    clients.append(client)
    with pytest.raises(TimeoutError):
        await client.get()


@pytest.mark.usefixtures("gather")
async def test_refused_is_an_os_error(clients: list[MetricsClient]) -> None:
    client = MetricsClient("127.0.0.1", free_port(), "/metrics", 1.0)
    clients.append(client)
    with pytest.raises(OSError):
        await client.get()


async def test_gathered_answers_are_read_together_without_watching_the_sockets(
    raw_server: StartRaw, clients: list[MetricsClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    from epick.datalayer import http

    server = await raw_server(lambda n: with_length(f"page {n}"))
    made = [MetricsClient("127.0.0.1", server.port, "/metrics", 1.0, gather_after=0.05) for _ in range(4)]
    clients.extend(made)
    await asyncio.gather(*(c.get() for c in made))  # connected
    readings: list[int] = []
    original = http._Gatherer._read

    def read(self: http._Gatherer) -> None:
        readings.append(len(self.waiting))
        original(self)

    monkeypatch.setattr(http._Gatherer, "_read", read)
    watched: list[int] = []
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "add_reader", lambda fd, *a: watched.append(fd))
    answers = await asyncio.gather(*(c.get() for c in made))
    assert answers == [(200, "page 1")] * 4
    assert readings == [4] and watched == []  # one reading for the four; no socket watched


async def test_a_gathered_answer_slower_than_the_gathering_is_waited_for(
    clients: list[MetricsClient],
) -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nsl")
        await writer.drain()
        await asyncio.sleep(0.05)  # the rest comes well after the gathering (5 ms)
        writer.write(b"ow page")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = MetricsClient("127.0.0.1", port, "/metrics", 1.0, gather_after=0.005)
    clients.append(client)
    try:
        assert await client.get() == (200, "slow page")
    finally:
        server.close()


async def test_a_gathered_connection_the_server_closed_or_spoke_on_unasked_is_not_reused(
    clients: list[MetricsClient],
) -> None:
    connections = 0
    answered, spoke = asyncio.Event(), asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(with_length(f"page on {connections}"))
            await writer.drain()
            if connections == 2:
                await answered.wait()
                writer.write(b"HTTP/1.1 200 OK\r\n")  # a stray head after the answer, nobody asked
                await writer.drain()
                spoke.set()
                await reader.read()
            elif connections == 3:
                await reader.read()
        finally:
            writer.close()  # the first: kept alive by its headers, closed all the same

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = MetricsClient("127.0.0.1", port, "/metrics", 1.0, gather_after=0.005)
    clients.append(client)
    try:
        assert await client.get() == (200, "page on 1")
        assert await client.get() == (200, "page on 2")  # closed since: a new connection
        answered.set()
        await spoke.wait()
        assert await client.get() == (200, "page on 3")  # stray bytes since: a new connection
    finally:
        server.close()


async def test_one_answer_that_breaks_the_reading_fails_its_own_get_alone(
    raw_server: StartRaw, clients: list[MetricsClient]
) -> None:
    good = await raw_server(lambda n: with_length("fine"))
    bad = await raw_server(lambda n: b"HTTP/1.1 \xc2\xb200 OK\r\nContent-Length: 0\r\n\r\n")  # '²00'
    made = [MetricsClient("127.0.0.1", port, "/metrics", 1.0, gather_after=0.005)
            for port in (bad.port, good.port, good.port)]  # fmt: skip
    clients.extend(made)
    outcomes = await asyncio.gather(*(c.get() for c in made), return_exceptions=True)
    assert isinstance(outcomes[0], HTTPError) and "not an HTTP/1.x response" in str(outcomes[0])
    assert outcomes[1:] == [(200, "fine"), (200, "fine")]


async def test_a_host_name_tries_each_of_its_addresses(clients: list[MetricsClient]) -> None:
    """'localhost' may resolve to ::1 first while the server listens on 127.0.0.1 only."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(with_length("by name"))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = MetricsClient("localhost", port, "/metrics", 1.0, gather_after=0.005)
    clients.append(client)
    try:
        assert await client.get() == (200, "by name")
    finally:
        server.close()


async def test_closing_a_client_with_a_get_in_flight_fails_that_get_at_once(
    clients: list[MetricsClient],
) -> None:
    answered = asyncio.Event()

    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await answered.wait()
                writer.write(with_length("late"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(late, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = MetricsClient("127.0.0.1", port, "/metrics", 5.0, gather_after=0.005)
    clients.append(client)
    try:
        pending = asyncio.ensure_future(client.get())
        await wait_until(lambda: client._gathered is not None and client._gathered.waiter is not None,
                         what="the GET out")  # fmt: skip
        assert client._gathered is not None
        client._gathered.close()  # its connection goes: the GET tries once more, on a new one
        answered.set()
        # (Left pending, it would have ended in a TimeoutError after 5 s, with no second try.)
        assert await pending == (200, "late")
    finally:
        server.close()


async def test_a_client_whose_server_closes_after_each_answer_reads_as_they_come(
    raw_server: StartRaw, clients: list[MetricsClient]
) -> None:
    server = await raw_server(lambda n: with_length(f"once {n}", "Connection: close\r\n"))
    client = MetricsClient("127.0.0.1", server.port, "/metrics", 1.0, gather_after=0.005)
    clients.append(client)
    assert await client.get() == (200, "once 0")
    assert client.gather_after is None  # a connection per scrape: through the loop's transport
    assert await client.get() == (200, "once 0")
    assert server.connections == 2


async def test_a_large_gathered_page_is_read_whole(
    raw_server: StartRaw, clients: list[MetricsClient]
) -> None:
    page = "".join(f'vllm:family_{i}_bucket{{le="{i}"}} {i}\n' for i in range(40_000))  # ~1.2 MB
    server = await raw_server(lambda n: chunked(page[: len(page) // 2], page[len(page) // 2 :]))
    client = MetricsClient("127.0.0.1", server.port, "/metrics", 5.0, gather_after=0.001)
    clients.append(client)
    assert await client.get() == (200, page)
    assert await client.get() == (200, page)


def test_gathered_answers_under_uvloop() -> None:
    """As `epick serve` runs: uvloop's loop, several clients, a gathering between them."""
    import uvloop

    async def scrape() -> list[tuple[int, str]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    writer.write(with_length("uv"))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        made = [MetricsClient("127.0.0.1", port, "/metrics", 1.0, gather_after=0.005) for _ in range(4)]
        try:
            answers = []
            for _ in range(3):
                answers += await asyncio.gather(*(c.get() for c in made))
            return answers
        finally:
            for c in made:
                c.close()
            server.close()

    assert uvloop.run(scrape()) == [(200, "uv")] * 12
