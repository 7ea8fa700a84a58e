"""The proxy's HTTP/1.1 client (epick.proxy.upstream) against scripted servers on loopback: body
framings, keep-alive reuse, stale idle connections, interim responses, errors and timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from epick.proxy import upstream as upstream_module
from epick.proxy.upstream import Timeouts, UpstreamError, Upstreams

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """A request's head and its Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


@asynccontextmanager
async def server(script: Script) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A loopback server that runs `script(reader, writer, connection number)` per connection; the
    request heads it read are collected."""
    heads: list[bytes] = []
    count = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        try:
            await script(reader, writer, count)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield port, heads
    finally:
        srv.close()


async def until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Until `condition()` holds (it is a failure not to within `limit` seconds)."""
    async with asyncio.timeout(limit):
        while not condition():
            await asyncio.sleep(0.001)


def ok(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%b\r\n%b" % (len(body), b"".join(extra), body)


async def test_content_length_responses_reuse_one_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            _, body = await read_request(reader)
            writer.write(ok(b"echo:" + body, b"x-conn: %d\r\n" % n))
            await writer.drain()

    pool = Upstreams()
    async with server(script) as (port, _):
        for i in range(3):
            r = await pool.request(
                "127.0.0.1", port, "/v1/completions", headers=[("x-a", "b")], body=b"%d" % i
            )
            assert r.status == 200 and r.header("X-Conn") == "1"
            assert await r.read() == b"echo:%d" % i
            r.release()
        assert pool.opened == 1 and pool.idle == 1
    await pool.close()


async def test_the_request_is_written_as_given() -> None:
    seen: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head, body = await read_request(reader)
        seen.append(head + body)
        writer.write(ok(b""))

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/p?q=1", headers=[("X-Case", "Kept")], body=b"{}")
        await r.read()
        r.release()
    head = seen[0]
    assert head.startswith(b"POST /p?q=1 HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{port}\r\n".encode() in head and b"content-length: 2\r\n" in head
    assert b"X-Case: Kept\r\n" in head and head.endswith(b"\r\n\r\n{}")
    with pytest.raises(ValueError, match="line break"):
        await pool.request("127.0.0.1", port, "/", headers=[("x-evil", "a\r\nx-injected: 1")], body=b"")
    await pool.close()


async def test_a_chunked_stream_arrives_chunk_by_chunk() -> None:
    step = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
        )
        for word in (b"data: one\n\n", b"data: two\n\n"):
            writer.write(b"%x\r\n%b\r\n" % (len(word), word))
            await writer.drain()
            await step.wait()
            step.clear()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        got = []
        async for chunk in r.chunks():
            got.append(chunk)
            step.set()  # the next chunk is sent only after this one was read
        assert got == [b"data: one\n\n", b"data: two\n\n"]
        r.release()
        assert pool.idle == 1  # read to the end: kept
    await pool.close()


async def test_a_close_delimited_body_ends_with_the_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        assert await r.read() == b"all of it"
        r.release()
        assert pool.idle == 0
    await pool.close()


async def test_an_interim_response_in_the_same_packet_is_skipped() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"final", b"x-final: yes\r\n"))
        await writer.drain()
        await reader.read()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await asyncio.wait_for(pool.request("127.0.0.1", port, "/", headers=[], body=b""), 5)
        assert r.status == 200 and r.header("x-final") == "yes"
        assert await r.read() == b"final"
        r.release()
    await pool.close()


async def test_an_idle_connection_the_server_closed_is_replaced_transparently() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(ok(b"conn %d" % n))
        await writer.drain()
        if n == 1:
            return  # the server closes the kept-alive connection right after answering
        await reader.read()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        assert await r.read() == b"conn 1"
        r.release()
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        assert await r.read() == b"conn 2"
        r.release()
        assert pool.opened == 2
    await pool.close()


async def test_a_body_cut_short_is_an_error() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        with pytest.raises(UpstreamError, match="closed by the server"):
            await r.read()
        r.release()
        assert pool.idle == 0
    await pool.close()


async def test_a_silence_longer_than_the_read_timeout_is_a_timeout() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await reader.read()  # then nothing

    pool = Upstreams(Timeouts(read=0.2))
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        chunks = r.chunks()
        assert await anext(chunks) == b"first"
        with pytest.raises(TimeoutError):
            await anext(chunks)
        r.release()
    await pool.close()


async def test_no_server_and_a_malformed_answer_are_upstream_errors() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await reader.read()

    pool = Upstreams()
    async with server(script) as (port, _):
        with pytest.raises(UpstreamError, match="malformed HTTP response"):
            await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
    with pytest.raises(UpstreamError, match="cannot connect"):
        await pool.request("127.0.0.1", port, "/", headers=[], body=b"")  # the server is gone
    await pool.close()


async def test_a_response_released_before_its_end_closes_its_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            if n == 1:  # the head and part of the body; the rest never comes
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npart")
            else:
                writer.write(ok(b"x" * 1000))
            await writer.drain()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        r.release()
        assert pool.idle == 0  # half a response on it: the connection cannot carry another
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        await until(lambda: r._conn.complete)  # the whole body is in; released unread, it is clean
        r.release()
        assert pool.idle == 1 and pool.opened == 2
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        assert await r.read() == b"x" * 1000  # the unread body did not leak into this response
        r.release()
        assert pool.opened == 2
    await pool.close()


async def test_a_slow_reader_pauses_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstream_module, "HIGH_WATER", 64 * 1024)
    size = 4 * 1024 * 1024

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"y" * 65536)
            await writer.drain()
        await reader.read()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        conn = r._conn
        await until(lambda: conn.paused)  # the reader dawdles: the body piles up, reading pauses
        assert conn.buffered < size // 4  # bounded: the server waits instead
        total = 0
        async for chunk in r.chunks():
            total += len(chunk)
        assert total == size and not conn.paused
        r.release()
    await pool.close()


async def test_connections_idle_too_long_are_not_reused() -> None:

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(ok(b"conn %d" % n))
            await writer.drain()

    pool = Upstreams()
    async with server(script) as (port, _):
        for expected in (b"conn 1", b"conn 1"):  # back to back: reused
            r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
            assert await r.read() == expected
            r.release()
        for conn in pool._idle[("127.0.0.1", port)]:  # as if idle longer than the limit
            conn.idle_since -= upstream_module.IDLE_SECONDS + 1
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        assert await r.read() == b"conn 2"
        r.release()
        assert pool.opened == 2 and pool.idle == 1
    await pool.close()


# --- relay: the body handed over from the connection's callbacks


async def test_relay_hands_over_each_chunk_and_keeps_the_connection() -> None:
    step = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"5\r\nearly\r\n")  # arrives before the relay begins: handed over first
        await writer.drain()
        await step.wait()
        for word in (b"one", b"two"):
            writer.write(b"%x\r\n%b\r\n" % (len(word), word))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        await until(lambda: bool(r._conn.body))
        got: list[bytes] = []

        def sink(chunk: bytes) -> bool:
            got.append(chunk)
            step.set()
            return True

        async def drained() -> None:
            raise AssertionError("the sink never asked to wait")

        await r.relay(sink, drained)
        assert got == [b"early", b"one", b"two"]
        assert r._conn.sink is None
        r.release()
        assert pool.idle == 1  # relayed to the end: kept
    await pool.close()


async def test_relay_pauses_the_server_while_the_sink_is_full() -> None:
    size, piece = 2 * 1024 * 1024, 65536
    sent = 0

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // piece):
            writer.write(b"z" * piece)
            await writer.drain()
            sent += piece
        await reader.read()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        received = 0
        full = asyncio.Event()
        room = asyncio.Event()
        seen_while_full: list[int] = []

        def sink(chunk: bytes) -> bool:
            nonlocal received
            received += len(chunk)
            if received < size // 2 or room.is_set():
                return True
            full.set()
            return False  # the reader is full: reading pauses

        async def drained() -> None:
            seen_while_full.append(received)
            await asyncio.sleep(0.05)  # the client takes its time; nothing arrives meanwhile
            assert received == seen_while_full[-1]
            room.set()

        await r.relay(sink, drained)
        assert full.is_set() and received == size and not r._conn.paused
        r.release()
    await pool.close()


async def test_relay_a_silence_longer_than_the_read_timeout_is_a_timeout() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(5):  # chunks that keep coming for longer than the timeout, then nothing
            writer.write(b"5\r\nchunk\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        await reader.read()

    pool = Upstreams(Timeouts(read=0.25))
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        got: list[bytes] = []

        async def drained() -> None:
            pass

        with pytest.raises(TimeoutError):
            await r.relay(lambda chunk: got.append(chunk) is None, drained)
        assert got == [b"chunk"] * 5  # the silence counts from the last chunk, not the first
        r.release()
        assert pool.idle == 0
    await pool.close()


async def test_relay_a_silence_is_counted_from_the_last_chunk() -> None:
    sent_last = asyncio.get_running_loop().create_future()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"4\r\nlast\r\n")  # early in the first wait; then nothing
        await writer.drain()
        await reader.read()

    pool = Upstreams(Timeouts(read=1.0))
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        loop = asyncio.get_running_loop()

        def sink(chunk: bytes) -> bool:
            sent_last.set_result(loop.time())
            return True

        async def drained() -> None:
            pass

        with pytest.raises(TimeoutError):
            await r.relay(sink, drained)
        silence = loop.time() - sent_last.result()
        # 1 s after the last chunk, not a whole read timeout after the wait it came in (1.9 s).
        assert 0.95 <= silence < 1.5, silence
        r.release()
    await pool.close()


async def test_relay_a_body_cut_short_is_an_error() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()

    pool = Upstreams()
    async with server(script) as (port, _):
        r = await pool.request("127.0.0.1", port, "/", headers=[], body=b"")
        got: list[bytes] = []

        async def drained() -> None:
            pass

        with pytest.raises(UpstreamError, match="closed by the server"):
            await r.relay(lambda chunk: got.append(chunk) is None, drained)
        assert b"".join(got) == b"only this"
        r.release()
    await pool.close()
