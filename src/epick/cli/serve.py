"""`epick serve`: discovery, scraping, the director and the proxy, with epick's own /metrics."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import random
import signal
import socket
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import uvloop
import yaml
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epick.cli.workers import Supervisor, WorkerLink, cores_available, default_workers
from epick.config import ConfigError, LoadedConfig, load_config
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.discovery.file import FileDiscoveryRunner
from epick.datalayer.discovery.kubernetes import KubernetesDiscovery
from epick.datalayer.discovery.static import DiscoveryError, load_endpoints_file, parse_endpoints_flag
from epick.datalayer.health import EndpointHealth, OutlierPolicy
from epick.datalayer.kvevents import KVEventsCollector, KVEventSubscribers, sinks_of
from epick.datalayer.models import ModelCatalog
from epick.datalayer.objectives import Objective
from epick.datalayer.objectives import priorities as objective_priorities
from epick.datalayer.rewrites import ModelRewrites, Rewrite, RewriteError, for_pool, parse_rewrites
from epick.datalayer.scraper import ScraperPool
from epick.datalayer.shared import NAME as SHARED_METRICS
from epick.datalayer.shared import SharedMetrics
from epick.extproc.server import ExtProcOptions, ExtProcServer
from epick.extproc.tls import TlsFileError
from epick.plugins.duration import parse_duration
from epick.plugins.filters.utilization import UtilizationDetector
from epick.proxy.server import Proxy, ProxyOptions
from epick.requestcontrol.director import Director
from epick.requestcontrol.metrics import EppMetrics

log = logging.getLogger("epick.serve")


@dataclass(frozen=True, slots=True)
class KubernetesOptions:
    namespace: str
    pool: str | None = None
    selector: str | None = None
    target_ports: tuple[int, ...] = ()
    kubeconfig: str | None = None
    # With a pool: watch the InferenceModelRewrites whose poolRef names it (beside any rewrites file).
    watch_rewrites: bool = True
    # With a pool: watch its InferenceObjectives (objective name -> priority, beside --objective).
    watch_objectives: bool = True


@dataclass(frozen=True, slots=True)
class ServeOptions:
    endpoints: tuple[EndpointSpec, ...] = ()
    kubernetes: KubernetesOptions | None = None
    config_file: str | None = None
    proxy: ProxyOptions | None = field(default_factory=ProxyOptions)
    extproc: ExtProcOptions | None = None
    metrics_port: int | None = 9090
    metrics_host: str = "0.0.0.0"
    refresh_metrics_interval: float = 0.05
    metrics_staleness_threshold: float | None = None
    objectives: tuple[tuple[str, int], ...] = ()
    pool_name: str = "epick"
    seed: int | None = None
    # Both front ends refuse larger request bodies with 413; None: the proxy's limit (or its default).
    max_body_bytes: int | None = None
    # InferenceModelRewrite resources (YAML); those whose poolRef names another pool are skipped when
    # a pool name was given.
    model_rewrites_file: str | None = None
    rewrites_pool: str | None = None
    outliers: OutlierPolicy = field(default_factory=OutlierPolicy)
    # The token histograms from each response's usage; off, responses are read only when a plugin
    # needs them (and ext_proc asks the gateway for less of each response).
    usage_metrics: bool = True


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the endpoint picker as an OpenAI-compatible proxy")
    p.add_argument("--config-file", help="EndpointPickerConfig (default: the built-in default config)")
    p.add_argument("--endpoints", help="static endpoints: host:port,host:port,...")
    p.add_argument("--endpoints-file", help="static endpoints with names and labels (YAML or JSON)")
    p.add_argument(
        "--pool-name", help="Kubernetes: the InferencePool whose pods to serve (also the metrics label)"
    )
    p.add_argument(
        "--pool-namespace", default=None, help="Kubernetes namespace (default: $NAMESPACE or default)"
    )
    p.add_argument(
        "--endpoint-selector", help="Kubernetes: serve pods matching this label selector instead of a pool"
    )
    p.add_argument(
        "--endpoint-target-ports", default="8000", help="with --endpoint-selector: ports, comma-separated"
    )
    p.add_argument(
        "--kubeconfig", help="Kubernetes: kubeconfig file (default: in-cluster, then ~/.kube/config)"
    )
    p.add_argument("--host", default="0.0.0.0", help="address every server of epick listens on")
    p.add_argument("--proxy-port", type=int, default=8080, help="the OpenAI-compatible proxy")
    p.add_argument("--no-proxy", action="store_true", help="do not run the proxy (a gateway uses ext_proc)")
    p.add_argument("--grpc-port", type=int, default=9002, help="Envoy external processing (ext_proc)")
    p.add_argument("--grpc-health-port", type=int, default=9003)
    p.add_argument("--no-extproc", action="store_true", help="do not run the ext_proc server")
    p.add_argument(
        "--secure-serving",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="TLS on the ext_proc and health ports (self-signed unless --cert-path), as the Go EPP",
    )
    p.add_argument("--cert-path", help="directory with tls.crt and tls.key for the ext_proc and health ports")
    p.add_argument(
        "--enable-cert-reload",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="re-read the certificate (and client CA) when the files change (cert-manager rotation)",
    )
    p.add_argument(
        "--client-ca-file", help="PEM CA bundle: ext_proc clients must present a certificate it signed"
    )
    p.add_argument(
        "--grpc-health-plaintext",
        action="store_true",
        help="serve the health port without TLS (Kubernetes' grpc probes cannot speak TLS)",
    )
    p.add_argument(
        "--max-extproc-streams", type=int, default=10_000, help="open ext_proc streams (0: no limit)"
    )
    p.add_argument("--metrics-port", type=int, default=9090, help="epick's own /metrics (0: off)")
    p.add_argument("--refresh-metrics-interval", default="50ms", help="scrape interval per endpoint")
    p.add_argument(
        "--metrics-staleness-threshold", default=None, help="metrics older than this count as saturated"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=16 * 1024 * 1024,
        help="largest request body (413 above), both front ends",
    )
    p.add_argument("--connect-timeout", default="5s")
    p.add_argument("--read-timeout", default="600s", help="longest silence between chunks of a response")
    p.add_argument(
        "--first-byte-timeout", default="120s", help="no response headers after this: try the next endpoint"
    )
    p.add_argument(
        "--request-timeout", default="1h", help="a request's deadline, attempts and stream included"
    )
    p.add_argument(
        "--head-timeout", default="10s", help="a client's request line and headers must arrive in this"
    )
    p.add_argument("--body-timeout", default="30s", help="and its body in this after them (408 if not)")
    p.add_argument(
        "--max-connections", type=int, default=10_000, help="open client connections (0: no limit)"
    )
    p.add_argument(
        "--outlier-consecutive-5xx",
        type=int,
        default=5,
        help="5xx or first-byte timeouts in a row that eject an endpoint (Envoy's default 5; 0: no outlier "
        "detection, and ext_proc need not see response headers for it)",
    )
    p.add_argument(
        "--outlier-base-ejection", default="30s", help="first ejection; the n-th in a row lasts n times this"
    )
    p.add_argument("--outlier-max-ejection", default="300s", help="the longest ejection")
    p.add_argument(
        "--objective",
        action="append",
        default=[],
        metavar="NAME=PRIORITY",
        help="priority of an objective named by x-gateway-inference-objective (repeatable)",
    )
    p.add_argument(
        "--model-rewrites",
        metavar="FILE",
        help="InferenceModelRewrite resources (YAML): model renames and weighted splits (reloaded on SIGHUP)",
    )
    p.add_argument(
        "--watch-model-rewrites",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --pool-name: also follow the pool's InferenceModelRewrite resources in the cluster",
    )
    p.add_argument(
        "--watch-objectives",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --pool-name: also follow the pool's InferenceObjective resources (request priorities)",
    )
    p.add_argument(
        "--expose-endpoint",
        action="store_true",
        help="proxy: name the serving endpoint (x-epick-endpoint) and failed ones in error bodies",
    )
    p.add_argument(
        "--usage-metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record the token histograms (inference_objective_*_tokens) from each response's usage; "
        "off, responses are read only when a plugin needs them, and ext_proc skips their bodies",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes serving the proxy and ext_proc on the same ports, sharing the scheduling "
        "state (epick.cli.workers); default: one per core available, or one where the config keeps "
        "state per process (flow control, plugins that do not share) or the gRPC ports are 0",
    )
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-count", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-hub", default=None, help=argparse.SUPPRESS)
    p.add_argument("--proxy-fds", default=None, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace) -> ServeOptions:
    try:
        kubernetes = None
        specs: list[EndpointSpec] = []
        sources = [
            bool(args.endpoints_file),
            bool(args.endpoints),
            bool(args.pool_name or args.endpoint_selector),
        ]
        if sum(sources) > 1 or (sum(sources) == 0 and not args.config_file):
            raise DiscoveryError(
                "give one source of endpoints: --endpoints host:port,..., --endpoints-file FILE, "
                "Kubernetes with --pool-name NAME or --endpoint-selector SELECTOR, or a config file "
                "whose dataLayer.discovery names a file-discovery plugin"
            )
        if sum(sources) == 0:
            pass  # the config's dataLayer.discovery (checked once the config is loaded)
        elif args.endpoints_file:
            specs = load_endpoints_file(args.endpoints_file)
        elif args.endpoints:
            specs = parse_endpoints_flag(args.endpoints)
        else:
            if args.pool_name and args.endpoint_selector:
                raise DiscoveryError("give --pool-name or --endpoint-selector, not both")
            ports = tuple(int(p) for p in args.endpoint_target_ports.split(",") if p.strip())
            kubernetes = KubernetesOptions(
                namespace=args.pool_namespace or os.environ.get("NAMESPACE", "default"),
                pool=args.pool_name if not args.endpoint_selector else None,
                selector=args.endpoint_selector,
                target_ports=ports if args.endpoint_selector else (),
                kubeconfig=args.kubeconfig,
                watch_rewrites=args.watch_model_rewrites,
                watch_objectives=args.watch_objectives,
            )
        objectives = []
        for item in args.objective:
            name, sep, priority = item.partition("=")
            if not sep or not name or not priority.lstrip("-").isdigit():
                raise ValueError(f"--objective {item!r}: expected NAME=PRIORITY with an integer priority")
            objectives.append((name, int(priority)))
        staleness = (
            parse_duration(args.metrics_staleness_threshold) if args.metrics_staleness_threshold else None
        )
        return ServeOptions(
            endpoints=tuple(specs),
            kubernetes=kubernetes,
            config_file=args.config_file,
            proxy=None
            if args.no_proxy
            else ProxyOptions(
                host=args.host,
                port=args.proxy_port,
                connect_timeout=parse_duration(args.connect_timeout),
                read_timeout=parse_duration(args.read_timeout),
                max_body_bytes=args.max_body_bytes,
                expose_endpoint=args.expose_endpoint,
                first_byte_timeout=parse_duration(args.first_byte_timeout),
                request_timeout=parse_duration(args.request_timeout),
                head_timeout=parse_duration(args.head_timeout),
                body_timeout=parse_duration(args.body_timeout),
                max_connections=args.max_connections,
            ),
            extproc=None
            if args.no_extproc
            else ExtProcOptions(
                host=args.host,
                port=args.grpc_port,
                health_port=args.grpc_health_port,
                secure=args.secure_serving,
                cert_path=args.cert_path,
                client_ca_path=args.client_ca_file,
                cert_reload=args.enable_cert_reload,
                health_plaintext=args.grpc_health_plaintext,
                max_streams=args.max_extproc_streams or None,
            ),
            metrics_port=args.metrics_port or None,
            metrics_host=args.host,
            refresh_metrics_interval=parse_duration(args.refresh_metrics_interval),
            metrics_staleness_threshold=staleness,
            objectives=tuple(objectives),
            pool_name=args.pool_name or "epick",
            max_body_bytes=args.max_body_bytes,
            model_rewrites_file=args.model_rewrites,
            rewrites_pool=args.pool_name,
            outliers=OutlierPolicy(
                consecutive_failures=args.outlier_consecutive_5xx,
                base_ejection_s=parse_duration(args.outlier_base_ejection),
                max_ejection_s=parse_duration(args.outlier_max_ejection),
            ),
            usage_metrics=args.usage_metrics,
        )
    except (DiscoveryError, ValueError) as e:
        raise SystemExit(f"epick serve: {e}") from None


class Service:
    """Everything `epick serve` runs, startable and stoppable in-process (tests and the demo use it)."""

    def __init__(self, options: ServeOptions, config: LoadedConfig | None = None) -> None:
        self.options = options
        self.config = config or self._load()
        self.datastore = Datastore()
        self.datastore.replace_all(options.endpoints)
        self.metrics = EppMetrics(
            options.pool_name, self.datastore, lambda: self.director.config, usage=options.usage_metrics
        )
        self.scrapers = ScraperPool(
            self.datastore, interval=options.refresh_metrics_interval, plan=self.config.data_layer
        )
        self.catalog = ModelCatalog(self.datastore)
        self.kv_events = KVEventSubscribers(self.datastore)
        self.metrics.registry.register(KVEventsCollector(self.kv_events))
        self.health = EndpointHealth(self.datastore, options.outliers)
        self._rewrite_rng = random.Random(options.seed)  # one stream of weighted picks across reloads
        self._file_rewrites = self._load_rewrites()
        self._cluster_rewrites: list[Rewrite] = []
        self.director = Director(
            self._prepare(self.config),
            self.datastore,
            max_body_bytes=options.max_body_bytes
            or (options.proxy.max_body_bytes if options.proxy else ProxyOptions().max_body_bytes),
            objectives=dict(options.objectives),
            known_models=self.catalog.known,
            observer=self.metrics,
            flow_observer=self.metrics.flow,
            rewrites=self._rewrites(),
            health=self.health,
        )
        self.proxy = (
            Proxy(self.director, self.datastore, self.catalog, options.proxy, self.health)
            if options.proxy
            else None
        )
        self.extproc = ExtProcServer(self.director, options.extproc) if options.extproc else None
        self._metrics_runner: web.AppRunner | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.discovery: KubernetesDiscovery | FileDiscoveryRunner | None = None
        k8s = options.kubernetes
        configured = self.config.data_layer.discovery
        if configured is not None and (k8s is not None or options.endpoints):
            log.warning(
                "dataLayer.discovery (%s) is ignored: endpoints come from the command line",
                configured.typed_name,
            )
        elif configured is not None:
            self.discovery = FileDiscoveryRunner(self.datastore, configured)
        elif k8s is None and not options.endpoints and options.config_file is not None:
            log.warning("no endpoints: the config names no dataLayer.discovery and none were given")
        if k8s is not None:
            self.discovery = KubernetesDiscovery(
                self.datastore,
                k8s.namespace,
                pool=k8s.pool,
                selector=k8s.selector,
                target_ports=list(k8s.target_ports) or None,
                kubeconfig=k8s.kubeconfig,
                on_rewrites=self._cluster_rewrites_changed if k8s.pool and k8s.watch_rewrites else None,
                on_objectives=self._cluster_objectives_changed if k8s.pool and k8s.watch_objectives else None,
            )

    def _load(self, previous: LoadedConfig | None = None) -> LoadedConfig:
        return load_config(self.options.config_file, seed=self.options.seed, previous=previous)

    def _rewrites(self) -> ModelRewrites:
        """The rewrites in force: the file's and the cluster's, under GIE's precedence."""
        return ModelRewrites((*self._file_rewrites, *self._cluster_rewrites), self._rewrite_rng)

    def _cluster_objectives_changed(self, found: list[Objective]) -> None:
        """The pool's InferenceObjectives changed: they name priorities, over the --objective flags."""
        self.director.set_objectives({**dict(self.options.objectives), **objective_priorities(found)})

    def _cluster_rewrites_changed(self, rewrites: list[Rewrite]) -> None:
        self._cluster_rewrites = rewrites
        self.director.rewrites = self._rewrites()

    def _load_rewrites(self) -> list[Rewrite]:
        """The rewrites file's resources for this pool; raises `RewriteError` naming what is wrong."""
        path = self.options.model_rewrites_file
        if path is None:
            return []
        try:
            with open(path, encoding="utf-8") as f:
                documents = list(yaml.safe_load_all(f))
        except (OSError, yaml.YAMLError) as e:
            raise RewriteError(f"{path}: cannot read model rewrites: {e}") from None
        found = parse_rewrites(documents, path)
        kept = for_pool(found, self.options.rewrites_pool)
        for skipped in sorted({r.name for r in found} - {r.name for r in kept}):
            log.warning("%s: %s %r names another pool; skipped", path, "InferenceModelRewrite", skipped)
        return kept

    def _prepare(self, config: LoadedConfig) -> LoadedConfig:
        config.scheduler.timer = self.metrics
        staleness = self.options.metrics_staleness_threshold
        if staleness is not None:
            # The admission detector and any utilization-detector used as a filter alike.
            detectors = {id(d): d for d in config.plugins.values() if isinstance(d, UtilizationDetector)}
            if isinstance(config.saturation_detector, UtilizationDetector):
                detectors[id(config.saturation_detector)] = config.saturation_detector
            for detector in detectors.values():
                detector.params = detector.params.model_copy(
                    update={"metrics_staleness_threshold": staleness}
                )
        return config

    def reload(self) -> bool:
        """Load the config file and the model rewrites again; on any error keep the running ones (both)
        and log why."""
        try:
            fresh = self._load(previous=self.director.config)  # unchanged plugins keep their state
            file_rewrites = self._load_rewrites()
        except ConfigError as e:
            for issue in e.issues:
                log.error("config reload refused, keeping the running config: %s", issue.render(e.source))
            return False
        except RewriteError as e:
            log.error("reload refused, keeping the running config and rewrites: %s", e)
            return False
        self.director.replace_config(self._prepare(fresh))
        self.scrapers.set_plan(fresh.data_layer)
        self._reload_discovery(fresh)
        self._in_background(self.kv_events.set_sinks(sinks_of(fresh.plugins.values())), "KV events reload")
        self._file_rewrites = file_rewrites
        self.director.rewrites = self._rewrites()
        log.info("config reloaded from %s", self.options.config_file or "<default config>")
        return True

    def _reload_discovery(self, fresh: LoadedConfig) -> None:
        """A file discovery the reloaded config configures differently replaces the running one."""
        running, wanted = self.discovery, fresh.data_layer.discovery
        if not isinstance(running, FileDiscoveryRunner):
            if wanted is not None:
                log.warning("dataLayer.discovery is ignored: endpoints come from the command line")
            return
        if wanted is None:
            log.warning("dataLayer.discovery was removed; the running file discovery stays until a restart")
            return
        if wanted is running.plugin:
            return  # kept by the reload: unchanged
        replacement = FileDiscoveryRunner(self.datastore, wanted)
        self.discovery = replacement

        async def swap() -> None:
            await running.stop()
            await replacement.start(initial=False)
            log.info("file discovery now reads %s", replacement.source)

        self._in_background(swap(), "file discovery reload")

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` on the serving loop (not serving yet: start() does what it would)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            work.close()
            return
        task = loop.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def start(self, proxy_socket: socket.socket | None = None) -> None:
        """Start serving; the proxy accepts on `proxy_socket` when given (already listening)."""
        if self.discovery is not None:
            await self.discovery.start()  # lists first: endpoints are known before anything serves
        await self.scrapers.start()
        await self.kv_events.start(sinks_of(self.director.config.plugins.values()))
        await self.catalog.start()
        if self.proxy is not None:
            await self.proxy.start(proxy_socket)
        if self.extproc is not None:
            await self.extproc.start()
        if self.options.metrics_port is not None:
            app = web.Application()
            app.router.add_get("/metrics", self._serve_metrics)
            self._metrics_runner = web.AppRunner(app, access_log=None)
            await self._metrics_runner.setup()
            await web.TCPSite(
                self._metrics_runner, self.options.metrics_host, self.options.metrics_port
            ).start()

    @property
    def metrics_bound_port(self) -> int:
        """The port /metrics listens on (the one asked for, or the one port 0 chose); 0: none."""
        if self._metrics_runner is None or not self._metrics_runner.addresses:
            return 0
        return int(self._metrics_runner.addresses[0][1])

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        if self.extproc is not None:
            await self.extproc.stop()
        await self.director.close()
        await self.kv_events.stop()
        await self.catalog.stop()
        await self.scrapers.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


async def _main(options: ServeOptions, config: LoadedConfig | None = None) -> None:
    service = Service(options, config)
    await service.start()
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
        "TLS" if options.extproc and options.extproc.secure else "plaintext",
        options.metrics_port,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await service.stop()


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


async def _worker_main(options: ServeOptions, args: argparse.Namespace) -> None:
    """One of `--workers`' processes: the service on the supervisor's socket, linked to its hub."""
    proxy = dataclasses.replace(options.proxy, worker=args.worker_index) if options.proxy else None
    extproc = dataclasses.replace(options.extproc, shared_ports=True) if options.extproc else None
    options = dataclasses.replace(
        options, metrics_port=0, metrics_host="127.0.0.1", proxy=proxy, extproc=extproc
    )
    service = Service(options)
    if args.worker_count and args.worker_count > 1:  # the workers take turns scraping core metrics
        service.scrapers.share = (args.worker_index, args.worker_count)
    link = WorkerLink(
        args.worker_hub,
        args.worker_index,
        lambda: service.director.config.plugins,
        shared={SHARED_METRICS: SharedMetrics(service.datastore, service.scrapers)},
        workers=args.worker_count or 0,
    )
    await link.connect()  # the shared state first: then serve
    service.director.before_schedule = link.catch_up
    fds = [int(fd) for fd in args.proxy_fds.split(",")] if args.proxy_fds else []
    await service.start(socket.socket(fileno=fds[args.worker_index]) if fds else None)
    if fds and service.proxy is not None:
        server = service.proxy.server
        link.serve_sockets(
            # A socket of its own each time (closed when released): the inherited fd stays open.
            lambda i: server.accept_also(i, socket.socket(fileno=os.dup(fds[i]))),
            server.stop_accepting,
        )
    link.report_metrics(service.metrics_bound_port)
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def reload() -> None:
        if service.reload():
            link.attach()

    loop.add_signal_handler(signal.SIGHUP, reload)
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    settle_gc()
    try:
        await stopped.wait()
    finally:
        await link.stop()
        await service.stop()


def _serve_args(argv: list[str]) -> list[str]:
    """`epick serve`'s arguments as given, without `--workers`: what each worker runs."""
    rest = argv[argv.index("serve") + 1 :] if "serve" in argv else list(argv)
    out: list[str] = []
    skip = False
    for arg in rest:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return out


def _grpc_ports_fixed(options: ServeOptions) -> bool:
    """Whether ext_proc's ports can be shared by workers: no ext_proc, or neither port 0."""
    return options.extproc is None or 0 not in (options.extproc.port, options.extproc.health_port)


def _supervise(args: argparse.Namespace, options: ServeOptions, workers: int) -> Supervisor:
    if options.proxy is None and options.extproc is None:
        raise ValueError("--workers above 1 needs the proxy or ext_proc to serve")
    if not _grpc_ports_fixed(options):
        raise ValueError("--workers above 1 shares the gRPC ports between workers: give them fixed (not 0)")
    return Supervisor(
        _serve_args(args.argv),
        workers,
        host=options.proxy.host if options.proxy else options.extproc.host,  # type: ignore[union-attr]
        port=options.proxy.port if options.proxy else None,
        metrics_host=options.metrics_host,
        metrics_port=options.metrics_port,
        extproc_ports=(options.extproc.port, options.extproc.health_port) if options.extproc else (),
    )


def _workers(args: argparse.Namespace, options: ServeOptions) -> tuple[int, LoadedConfig | None]:
    """How many worker processes to run, and the config when it was loaded to decide (a single
    process serves it, not loading it twice): `--workers` as given (flow control refused above 1),
    or the default chosen from the cores and the config (logged with its reason). 0 means refused."""
    if args.workers == 1 or (args.workers is None and options.proxy is None and options.extproc is None):
        return 1, None
    config = load_config(options.config_file, seed=options.seed)  # checked once, here
    if args.workers is None:
        count, reason = default_workers(
            cores_available(),
            config.plugins,
            flow_control=config.flow_control is not None,
            grpc_ports_fixed=_grpc_ports_fixed(options),
        )
        log.info("serving with %d worker process%s: %s", count, "es" if count > 1 else "", reason)
        return count, config
    if args.workers > 1 and config.flow_control is not None:
        print("epick serve: flow control cannot run with --workers above 1: its queues are "
              "one process's (run with --workers 1)", file=sys.stderr)  # fmt: skip
        return 0, None
    return int(args.workers), config


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = options_from(args)
    if args.workers is not None and args.workers < 1:
        print("epick serve: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            if args.worker_hub is not None:
                uvloop.run(_worker_main(options, args))
                return 0
            workers, config = _workers(args, options)
            if workers == 0:
                return 2
            if workers > 1:
                uvloop.run(_supervise(args, options, workers).run())
            else:
                uvloop.run(_main(options, config))
    except ConfigError as e:
        for issue in e.issues:
            print(issue.render(e.source), file=sys.stderr)
        return 2
    except (DiscoveryError, RewriteError, TlsFileError) as e:
        print(f"epick serve: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"epick serve: {e}", file=sys.stderr)
        return 2
    return 0


__all__ = ["ServeOptions", "Service", "add_parser"]
