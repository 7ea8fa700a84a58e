"""A minimal keep-alive HTTP/1.1 GET client for /metrics, on asyncio streams.

Scraping hundreds of endpoints every 50 ms is thousands of GETs a second; aiohttp's client costs
about 0.3 ms of CPU per GET there (benchmarks/bench_service.py), this one a fraction of that. It does
only what a scrape needs: GET one path on a persistent connection, read a Content-Length or chunked
body, reconnect when the server closes. Anything else about HTTP is out of scope on purpose.
"""

from __future__ import annotations

import asyncio
import ssl


class HTTPError(Exception):
    """The server answered something a scrape cannot use; the message says what."""


def tls_context(
    insecure_skip_verify: bool, ca_cert_path: str = "", client_cert_path: str = "", client_key_path: str = ""
) -> ssl.SSLContext:
    """A client TLS context as upstream's HTTP data sources build it: verification off with
    `insecureSkipVerify`, else against `caCertPath` (or the system roots); a client certificate for mTLS."""
    context = ssl.create_default_context(cafile=ca_cert_path or None)
    if insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert_path:
        context.load_cert_chain(client_cert_path, client_key_path or None)
    return context


class MetricsClient:
    def __init__(
        self,
        host: str,
        port: int,
        path: str = "/metrics",
        timeout: float = 1.0,
        *,
        tls: ssl.SSLContext | None = None,
        accept: str = "text/plain",
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.tls = tls
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: {accept}\r\n"
            "Accept-Encoding: identity\r\nUser-Agent: epick\r\n\r\n"
        ).encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(self) -> tuple[int, str]:
        """(status, body text). Raises OSError, TimeoutError or HTTPError."""
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    return await self._exchange()
                except (ConnectionError, asyncio.IncompleteReadError, HTTPError):
                    # A kept-alive connection the server dropped: one fresh attempt.
                    self.close()
                    return await self._exchange()
        except BaseException:
            # Never reuse a connection in an unknown state: a late answer would be read as the next one.
            self.close()
            raise

    async def _exchange(self) -> tuple[int, str]:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(
                self.host,
                self.port,
                limit=1 << 22,
                ssl=self.tls,
                server_hostname=self.host if self.tls else None,
            )
        reader, writer = self._reader, self._writer
        assert reader is not None
        writer.write(self._request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HTTPError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        status = int(parts[1])
        length = -1
        chunked = False
        keep_alive = True
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif name == "connection":
                keep_alive = "close" not in value.lower()
        if chunked:
            body = await self._read_chunked(reader)
        elif length >= 0:
            body = await reader.readexactly(length)
        else:
            body = await reader.read()
            keep_alive = False
        if not keep_alive:
            self.close()
        return status, body.decode("utf-8", "replace")

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HTTPError(f"bad chunk size {size_line[:40]!r}") from None
            if size == 0:
                await reader.readuntil(b"\r\n")  # the end of the (empty) trailer section
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
