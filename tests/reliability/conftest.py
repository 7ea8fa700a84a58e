"""Fixtures for the fault and fuzz tests: the proxy tests' fixtures, and `epick sim-server` processes
that a test can really kill or stop.

A sim-server process listens on a port the kernel picks (`--port 0`) and names it in its ready line;
every process a test starts is continued (SIGCONT), killed and reaped at teardown, whatever the test did.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass

import pytest

from tests.proxy.conftest import http, make_fake, make_service  # noqa: F401 (fixtures used here)

_READY = re.compile(rb"serving .* at http://(?P<host_port>[0-9.]+:[0-9]+) ")


@dataclass(slots=True)
class SimProcess:
    """One `epick sim-server` process serving one simulated server."""

    process: asyncio.subprocess.Process
    host_port: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.pid, signum)


StartSims = Callable[..., Awaitable[list[SimProcess]]]


@pytest.fixture
async def sim_processes() -> AsyncIterator[StartSims]:
    """`sim_processes(count, *extra_args)`: `count` sim-server processes, started together, ready."""
    started: list[asyncio.subprocess.Process] = []

    async def start(count: int = 1, *extra: str) -> list[SimProcess]:
        processes = []
        for _ in range(count):
            command = [sys.executable, "-m", "epick.cli.main", "sim-server", "--port", "0",
                       "--time-scale", "1000", "--seed", str(len(started)), *extra]  # fmt: skip
            process = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
            )
            started.append(process)
            processes.append(process)
        sims = []
        for process in processes:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            found = _READY.search(line)
            assert found is not None, f"sim-server did not start: {line!r}"
            sims.append(SimProcess(process, found["host_port"].decode()))
        return sims

    yield start
    for process in started:
        if process.returncode is None:
            with suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)  # a stopped process cannot die until continued
                process.kill()
        await process.wait()
