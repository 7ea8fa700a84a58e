"""Running a service until it is told to stop: one process, or a supervisor and its workers.

`serve(settings)` decides the worker count (`Settings.workers`, or the default from the cores and the
config), then runs one `Service` in this process, or a `Supervisor` whose worker processes each run
one (`epick.service.workers.process`). SIGTERM and SIGINT stop it gracefully (`Service.stop`), SIGHUP
reloads the config and the model rewrites.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import signal

import uvloop

from epick.config import LoadedConfig
from epick.service.service import Service, load_service_config
from epick.service.settings import Settings, SettingsError
from epick.service.workers import Supervisor, cores_available, default_workers

__all__ = ["GC_THRESHOLDS", "serve", "settle_gc", "until_stopped", "worker_count"]

log = logging.getLogger("epick.serve")

# A young collection every 50,000 net allocations instead of 700, the older ones as rarely as before
# relative to it: a request allocates thousands of short-lived objects, and almost none of them are
# part of a reference cycle.
GC_THRESHOLDS = (50_000, 20, 100)


def settle_gc() -> None:
    """Once started: what start-up built (modules, the config, compiled templates: some 74,000
    objects) lives as long as the process. Frozen, the cyclic collector no longer rescans it on each
    full collection (77 ms pauses under load before); and young collections run less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def worker_count(settings: Settings) -> tuple[int, LoadedConfig | None]:
    """How many worker processes to run, and the config when it was loaded to decide (a single
    process serves it, not loading it twice): `settings.workers` as given, or the default chosen from
    the cores and the config (logged with its reason). Raises `SettingsError` for flow control with
    more than one worker, and `ConfigError` for a bad config."""
    if settings.workers == 1 or (settings.workers is None and not (settings.proxy or settings.extproc)):
        return 1, None
    # Checked once, here (a single process serves it: built for one worker).
    config = load_service_config(dataclasses.replace(settings, workers=1))
    if settings.workers is None:
        count, reason = default_workers(cores_available(), config, grpc_ports_fixed=settings.grpc_ports_fixed)
        log.info("serving with %d worker process%s: %s", count, "es" if count > 1 else "", reason)
        return count, config
    if settings.workers > 1 and config.flow_control is not None:
        raise SettingsError(
            "flow control cannot run with workers above 1: its queues are one process's (run one worker)"
        )
    return settings.workers, config


async def until_stopped() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (handlers installed on the running loop)."""
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stopped.set)
    return stopped


async def _single(settings: Settings, config: LoadedConfig | None) -> None:
    service = Service(settings, config)
    stopped = await until_stopped()
    await service.start()
    try:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, service.reload)
        settle_gc()
        log.info(
            "epick serving %d endpoints from %s; proxy on :%s, ext_proc on :%s (%s), metrics on :%s",
            len(service.datastore),
            service.discovery.source if service.discovery else "a static list",
            service.proxy.port if service.proxy else "off",
            service.extproc.port if service.extproc else "off",
            "TLS" if settings.extproc and settings.extproc.secure else "plaintext",
            settings.metrics_port,
        )
        await stopped.wait()
        log.info("stopping: draining requests in flight (up to %gs)", settings.drain_timeout)
    finally:
        await service.stop()


def serve(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT. Raises `SettingsError`, `ConfigError` and the start-up errors
    of the parts (`OSError` for a port, `DiscoveryError`, `RewriteError`, `TlsFileError`)."""
    settings.check()
    workers, config = worker_count(settings)
    if workers > 1:
        uvloop.run(Supervisor(settings, workers, settings.min_workers, settings.worker_scaling).run())
    else:
        uvloop.run(_single(settings, config))
