"""One worker process: `python -m epick.service.workers.process --settings FILE --index I ...`.

The supervisor starts it with the service's settings (pickled, in a file only the supervisor
writes), its index and the hub's socket, and, when the proxy runs, the listening sockets it inherits.
The worker serves a whole `Service` on them, linked to the hub, until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import pickle
import signal
import socket
import sys

import uvloop
from prometheus_client import generate_latest

from epick.datalayer.shared import NAME as SHARED_METRICS
from epick.datalayer.shared import SharedMetrics
from epick.service.logs import configure_logging
from epick.service.run import settle_gc, until_stopped
from epick.service.service import Service
from epick.service.settings import Settings
from epick.service.workers.link import WorkerLink

log = logging.getLogger("epick.serve")


@dataclasses.dataclass(frozen=True, slots=True)
class Role:
    """What makes a worker one of several: its index, how many they are, the hub and the sockets."""

    index: int
    count: int
    hub: str
    proxy_fds: tuple[int, ...] = ()


def worker_settings(settings: Settings, role: Role) -> Settings:
    """The settings a worker serves with: its proxy numbered, the gRPC ports shared, its /metrics on
    a loopback port of its own, plain (the supervisor serves the merged page, with the settings'
    authentication and TLS); `workers` stays the count, which the config's plugins are built for."""
    proxy = dataclasses.replace(settings.proxy, worker=role.index) if settings.proxy else None
    extproc = dataclasses.replace(settings.extproc, shared_ports=True) if settings.extproc else None
    return dataclasses.replace(
        settings,
        metrics_port=0,
        metrics_host="127.0.0.1",
        # the loopback page only the supervisor reads: its own page is the guarded one
        metrics_auth=False,
        metrics_cert_dir=None,
        metrics_client_ca=None,
        proxy=proxy,
        extproc=extproc,
        workers=role.count,
    )


async def run_worker(settings: Settings, role: Role) -> None:
    """The service on the supervisor's sockets, linked to its hub, until SIGTERM."""
    service = Service(worker_settings(settings, role))
    if role.count > 1:  # the workers take turns scraping core metrics
        service.scrapers.share = (role.index, role.count)
    link = WorkerLink(
        role.hub,
        role.index,
        lambda: service.director.config,
        shared={SHARED_METRICS: SharedMetrics(service.datastore, service.scrapers)},
        lazy=frozenset({SHARED_METRICS}),
    )
    serving = 0

    def active(position: int, count: int) -> None:
        """The hub says which of the serving workers this one is (they follow the load): its turns to
        scrape; and when more serve than before, its clients' kept-alive connections close after
        their next response, and its gateways' gRPC connections get GOAWAY (their open streams
        finish), so that the kernel spreads the new connections over the new worker too."""
        nonlocal serving
        service.scrapers.set_share((position, count))
        if count > serving > 0:
            if service.proxy is not None:
                service.proxy.server.shed()
            if service.extproc is not None:
                service.extproc.shed()
        serving = count

    link.on_active = active
    stopped = await until_stopped()
    retiring = False

    def retire() -> None:
        nonlocal retiring
        retiring = True
        stopped.set()

    link.on_retire = retire
    await link.connect()  # the shared state first: then serve
    service.director.before_schedule = link.catch_up
    service.link, service.worker_index = link, role.index  # --shared-state: tees the link's updates
    fds = role.proxy_fds
    await service.start(socket.socket(fileno=fds[role.index]) if fds else None)
    if fds and service.proxy is not None:
        server = service.proxy.server
        link.serve_sockets(
            # A socket of its own each time (closed when released): the inherited fd stays open.
            lambda i: server.accept_also(i, socket.socket(fileno=os.dup(fds[i]))),
            server.stop_accepting,
        )
    link.serving(service.metrics_bound_port)  # accepting: its socket and turns from now on

    def reload() -> None:
        if service.reload():
            link.attach()

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    settle_gc()
    try:
        await stopped.wait()
    finally:
        if retiring:  # linked while it drains (what it records still reaches the others), then counted
            log.info("worker %d retires: draining its requests", role.index)
            await service.stop()
            await link.leave(generate_latest(service.metrics.registry))
        else:
            await link.stop()
            await service.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="epick-worker", description=__doc__)
    parser.add_argument("--settings", required=True, help="the pickled Settings the supervisor wrote")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--proxy-fds", default="")
    args = parser.parse_args(argv)
    with open(args.settings, "rb") as f:
        settings = pickle.load(f)
    if not isinstance(settings, Settings):
        print(f"epick worker: {args.settings} holds no service settings", file=sys.stderr)
        return 2
    configure_logging(
        logging.getLevelName(settings.log_level.upper()), json_lines=settings.log_format == "json"
    )
    fds = tuple(int(fd) for fd in args.proxy_fds.split(",") if fd)
    uvloop.run(run_worker(settings, Role(args.index, args.count, args.hub, fds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
