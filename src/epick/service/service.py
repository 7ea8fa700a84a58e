"""The composition root: a running epick built from `Settings`.

`Service(settings)` builds, in this order: the config (loaded once), the datastore with any static
endpoints, the metrics, the data layer (scrapers, model catalog, KV-event subscribers, endpoint
health), the director, the front ends (proxy, ext_proc) and the discovery. Nothing runs until
`start()`, which starts them so that endpoints are known before anything serves:

    discovery (lists first) → scrapers → KV events → model catalog → proxy → ext_proc → /metrics

`stop()` is graceful, in the reverse sense: the front ends stop accepting and report NOT_SERVING,
the requests in flight get `drain_timeout` to finish, then the director, the data layer, discovery
and /metrics close. `reload()` loads the config and the model rewrites again; a bad one keeps the
running ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epick.config import ConfigError, LoadedConfig, LoadOptions, load_config, load_config_text
from epick.datalayer.datastore import Datastore
from epick.datalayer.discovery.file import FileDiscoveryRunner
from epick.datalayer.discovery.kubernetes import KubernetesDiscovery
from epick.datalayer.health import EndpointHealth
from epick.datalayer.kvevents import KVEventsCollector, KVEventSubscribers, sinks_of
from epick.datalayer.models import ModelCatalog
from epick.datalayer.objectives import Objective
from epick.datalayer.objectives import priorities as objective_priorities
from epick.datalayer.rewrites import Rewrite, RewriteError
from epick.datalayer.scraper import ScraperPool
from epick.datalayer.traffic import Traffic
from epick.extproc.health import HealthService
from epick.extproc.server import ExtProcServer
from epick.framework.parsing import protocol_mismatch
from epick.plugins.prefix.redis_index import normalize_address, redacted
from epick.proxy.server import Proxy
from epick.requestcontrol.director import Director, close_plugins
from epick.requestcontrol.metrics import DataLayerErrors, EppMetrics
from epick.requestcontrol.plugin_metrics import PluginMetrics
from epick.requestcontrol.tracing import TracedTimer
from epick.service.config_watch import ConfigFileWatch, ConfigReloads
from epick.service.leader import LeaderElector
from epick.service.metrics_server import MetricsAuth, MetricsServer, metrics_tls
from epick.service.plugin_state import PATH as PLUGIN_STATE_PATH
from epick.service.plugin_state import not_ready as plugins_not_ready
from epick.service.plugin_state import state_handler
from epick.service.profiling import profiling_routes
from epick.service.rewrites import RewriteSources
from epick.service.settings import Settings
from epick.service.shared_state import SharedState, scope_of
from epick.service.tracing import tracing_from_environment

if TYPE_CHECKING:
    from epick.service.workers.link import WorkerLink

__all__ = ["Service"]

log = logging.getLogger("epick.serve")

UTILIZATION_DETECTOR = "utilization-detector"  # upstream's saturation detector type
PLUGIN_READINESS_PERIOD_S = 1.0  # how often the plugins' readiness is asked between probes
RELEASE_TIMEOUT_S = 5.0  # at most this long releasing the leader Lease on stop


def load_service_config(settings: Settings, previous: LoadedConfig | None = None) -> LoadedConfig:
    """The config file the settings name, with what the service gives its plugins beyond the file:
    the worker count they are built for, and the command line's metrics staleness threshold over
    every utilization detector's (the admission detector's and any used as a filter)."""
    overrides: dict[str, dict[str, Any]] = {}
    if settings.metrics_staleness_threshold is not None:
        overrides[UTILIZATION_DETECTOR] = {"metricsStalenessThreshold": settings.metrics_staleness_threshold}
    options = LoadOptions(
        workers=settings.workers or 1,
        overrides=overrides,
        allow_experimental=settings.allow_experimental_plugins,
        feature_gates=settings.feature_gates,
        plugin_state_staleness=settings.plugin_state_staleness,
    )
    if settings.config_text is not None:
        return load_config_text(
            settings.config_text,
            source="--config-text",
            seed=settings.seed,
            previous=previous,
            options=options,
        )
    return load_config(settings.config_file, seed=settings.seed, previous=previous, options=options)


class Service:
    """Everything one epick process serves, startable and stoppable in-process."""

    def __init__(self, settings: Settings, config: LoadedConfig | None = None) -> None:
        settings.check()
        self.settings = settings
        self.config = config or self._load()
        # `--watch-config-file`: the file's content as just loaded, watched from start()
        watched = settings.config_file if settings.watch_config_file else None
        self.config_watch = ConfigFileWatch(watched) if watched else None
        self.datastore = Datastore()
        self.datastore.replace_all(settings.endpoints)
        self.metrics = EppMetrics(
            settings.pool_name,
            self.datastore,
            lambda: self.director.config,
            usage=settings.usage_metrics,
            namespace=settings.kubernetes.namespace if settings.kubernetes else "",
            fairness_limit=settings.fairness_id_label_limit,
        )
        self.reloads = ConfigReloads()  # SIGHUP's and --watch-config-file's
        self.metrics.registry.register(self.reloads)
        # The requests sent to each endpoint, for quiet scraping (None: off, as upstream).
        self.traffic = Traffic() if settings.idle_scrape_interval > 0 else None
        self.scrapers = ScraperPool(
            self.datastore,
            interval=settings.refresh_metrics_interval,
            plan=self.config.data_layer,
            idle_interval=settings.idle_scrape_interval,
            traffic=self.traffic,
        )
        self.metrics.registry.register(DataLayerErrors(self.scrapers.errors))
        self.catalog = ModelCatalog(self.datastore)
        self.kv_events = KVEventSubscribers(self.datastore)
        self.metrics.registry.register(KVEventsCollector(self.kv_events))
        self.outliers = EndpointHealth(self.datastore, settings.outliers)
        self.rewrites = RewriteSources(settings.model_rewrites_file, settings.rewrites_pool, settings.seed)
        self.tracing = tracing_from_environment() if settings.tracing else None  # before the timer
        self.director = Director(
            self._prepare(self.config),
            self.datastore.snapshot,
            max_body_bytes=settings.body_limit,
            objectives=dict(settings.objectives),
            known_models=self.catalog.known,
            observer=self.metrics,
            flow_observer=self.metrics.flow,
            rewrites=self.rewrites.current(),
            health=self.outliers,
        )
        if self.tracing is not None:
            self.director.tracing = self.tracing.tracing
        self.director.traffic = self.traffic
        self.director.subset_filter = settings.subset_filter
        self.director.emit_scores = settings.emit_endpoint_scores
        self.datastore.subscribe(self.director.endpoint_changed)
        self.proxy = (
            Proxy(
                self.director,
                self.datastore,
                self.catalog,
                dataclasses.replace(settings.proxy, max_bodies_bytes=settings.bodies_limit),
            )
            if settings.proxy
            else None
        )
        # Readiness: synced once the endpoints are known (a static list or a file at once, Kubernetes
        # when listed), leading when elected (with leader election), not draining.
        self.health = HealthService()
        self.health.synced = settings.kubernetes is None
        self.health.leader = None if settings.leader_election is None else False
        self.health.probe = lambda: plugins_not_ready(self.director.config.plugins)
        self.extproc = (
            ExtProcServer(
                self.director,
                dataclasses.replace(settings.extproc, max_bodies_bytes=settings.bodies_limit),
                self.health,
            )
            if settings.extproc
            else None
        )
        self.elector: LeaderElector | None = None
        # `--shared-state`: started with the service; under --workers, `link` is the worker's hub
        # link (set before `start`), which replicates the plugins and tees their updates here.
        self.shared_state: SharedState | None = None
        self.link: WorkerLink | None = None
        self.worker_index = 0
        self.metrics.registry.register(
            PluginMetrics(lambda: [self.shared_state] if self.shared_state else [])
        )
        if self.extproc is not None and self.extproc.stream_metrics is not None:
            self.metrics.registry.register(self.extproc.stream_metrics)
        self.metrics_server: MetricsServer | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.discovery = self._discovery()

    def _discovery(self) -> KubernetesDiscovery | FileDiscoveryRunner | None:
        settings, k8s = self.settings, self.settings.kubernetes
        configured = self.config.data_layer.discovery
        if configured is not None and (k8s is not None or settings.endpoints):
            log.warning(
                "dataLayer.discovery (%s) is ignored: endpoints come from the command line",
                configured.typed_name,
            )
        elif configured is not None:
            return FileDiscoveryRunner(self.datastore, configured)
        elif k8s is None and not settings.endpoints and settings.config_file is not None:
            log.warning("no endpoints: the config names no dataLayer.discovery and none were given")
        if k8s is None:
            return None
        return KubernetesDiscovery(
            self.datastore,
            k8s.namespace,
            pool=k8s.pool,
            selector=k8s.selector,
            target_ports=list(k8s.target_ports) or None,
            kubeconfig=k8s.kubeconfig,
            on_rewrites=self._cluster_rewrites_changed if k8s.pool and k8s.watch_rewrites else None,
            on_objectives=self._cluster_objectives_changed if k8s.pool and k8s.watch_objectives else None,
            on_synced=lambda synced: self.health.update(synced=synced),
            pool_group=k8s.pool_group,
            on_pool=self._check_protocol,
        )

    def _check_protocol(self) -> None:
        """The pool's appProtocol against the parsers: a mismatch keeps readiness off, as upstream."""
        discovery = self.discovery
        protocol = discovery.app_protocol if isinstance(discovery, KubernetesDiscovery) else ""
        mismatch = protocol_mismatch(self.director.config.parsers.parsers, protocol)
        if mismatch != self.health.not_ready:
            if mismatch is not None:
                log.error(
                    "not ready: %s (set the pool's appProtocol, or configure parsers that serve it)", mismatch
                )
            self.health.update(not_ready=mismatch)

    def _load(self, previous: LoadedConfig | None = None) -> LoadedConfig:
        return load_service_config(self.settings, previous=previous)

    def _cluster_objectives_changed(self, found: list[Objective]) -> None:
        """The pool's InferenceObjectives changed: they name priorities, over the settings' objectives."""
        self.director.set_objectives({**dict(self.settings.objectives), **objective_priorities(found)})

    def _cluster_rewrites_changed(self, rewrites: list[Rewrite]) -> None:
        self.rewrites.cluster = rewrites
        self.director.rewrites = self.rewrites.current()

    def _prepare(self, config: LoadedConfig) -> LoadedConfig:
        config.scheduler.timer = self._timer()  # the scheduler's plugin timings, in /metrics (and spans)
        return config

    def _timer(self) -> EppMetrics | TracedTimer:
        tracing = self.tracing
        return TracedTimer(self.metrics, tracing.tracing) if tracing is not None else self.metrics

    # --- reload ----------------------------------------------------------------------------------

    def reload(self) -> bool:
        """Load the config file and the model rewrites again; on any error keep the running ones (both)
        and log why."""
        try:
            fresh = self._load(previous=self.director.config)  # unchanged plugins keep their state
            file_rewrites = self.rewrites.read()
        except ConfigError as e:
            for issue in e.issues:
                log.error("config reload refused, keeping the running config: %s", issue.render(e.source))
            self.reloads.record("invalid")
            return False
        except RewriteError as e:
            log.error("reload refused, keeping the running config and rewrites: %s", e)
            self.reloads.record("invalid")
            return False
        running = self.director.config
        self.director.replace_config(self._prepare(fresh))
        if self.shared_state is not None:
            self.shared_state.attach(replicate=self.link is None)
        kept = {id(p) for p in fresh.plugins.values()}
        dropped = [p for p in running.plugins.values() if id(p) not in kept]
        if dropped:
            self._in_background(close_plugins(dropped), "closing the plugins a reload dropped")
        self._check_protocol()
        self._initialize_tokenizers(fresh)
        self.scrapers.set_plan(fresh.data_layer)
        self._reload_discovery(fresh)
        self._in_background(self.kv_events.set_sinks(sinks_of(fresh.plugins.values())), "KV events reload")
        self.rewrites.file = file_rewrites
        self.director.rewrites = self.rewrites.current()
        self.reloads.record("success")
        log.info(
            "config reloaded from %s (generation %d)",
            self.settings.config_file or "<default config>",
            self.reloads.generation,
        )
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

    # --- start and stop --------------------------------------------------------------------------

    async def start(self, proxy_socket: socket.socket | None = None) -> None:
        """Start serving; the proxy accepts on `proxy_socket` when given (already listening)."""
        if isinstance(self.discovery, KubernetesDiscovery):
            k8s = self.settings.kubernetes
            await self.discovery.start(wait_for_pool=k8s is not None and k8s.wait_for_pool)
        elif self.discovery is not None:
            await self.discovery.start()  # lists first: endpoints are known before anything serves
        await self.scrapers.start()
        await self.kv_events.start(sinks_of(self.director.config.plugins.values()))
        await self.catalog.start()
        await self._share_state()  # the other replicas' state before serving
        self._in_background(self._watch_plugin_readiness(), "plugin readiness")
        self._initialize_tokenizers(self.director.config)
        if self.config_watch is not None:
            self._in_background(self.config_watch.run(self.reload, self.reloads), "config file watch")
        if self.proxy is not None:
            await self.proxy.start(proxy_socket)
        if self.extproc is not None:
            await self.extproc.start()
        if self.settings.metrics_port is not None:
            self.metrics_server = self._metrics_server()
            await self.metrics_server.start(self.settings.metrics_host, self.settings.metrics_port)
        await self._elect()  # last: a replica that failed to start never holds the Lease

    def _initialize_tokenizers(self, config: LoadedConfig) -> None:
        """Tokenizers that must be initialized first (llm-d's tokenizer sidecar) are, in the
        background; until they are, they keep readiness off."""
        self._in_background(
            self.director.tokenization.prepare(config.plugins.values()), "tokenizer initialization"
        )

    async def _watch_plugin_readiness(self) -> None:
        """Ask the plugins whether they are ready every second, so that a change reaches those who
        watch the health service (and the log) without waiting for a probe."""
        while True:
            self.health.refresh()
            await asyncio.sleep(PLUGIN_READINESS_PERIOD_S)

    async def _share_state(self) -> None:
        """`--shared-state`, or the config's cross-replica syncer (the flag wins where both are given)."""
        plan = self.director.config.data_layer
        url = self.settings.shared_state
        if plan.syncer is not None:
            if url is None:
                url = plan.syncer.address
            elif normalize_address(url) != plan.syncer.address:
                log.warning(
                    "--shared-state %s is used; the config's crossReplicaSyncerPluginRef (%s, %s) is not",
                    redacted(normalize_address(url)),
                    plan.syncer.typed_name,
                    redacted(plan.syncer.address),
                )
        if url is None:
            return
        k8s = self.settings.kubernetes
        scope = scope_of(k8s.namespace, k8s.pool) if k8s is not None else scope_of("", None)
        shared = SharedState(
            normalize_address(url),
            scope,
            f"{self.settings.replica_id}/{self.worker_index}",
            lambda: self.director.config,
            local_worker=self.worker_index,
            interval=plan.sync_interval,
        )
        if self.link is not None:
            self.link.tee = shared.published
        await shared.start(replicate=self.link is None)
        self.shared_state = shared

    @staticmethod
    async def _release_lease(elector: LeaderElector) -> None:
        try:
            await asyncio.wait_for(elector.stop(), RELEASE_TIMEOUT_S)
        except TimeoutError:
            log.warning(
                "the leader Lease was not released in %gs; a standby takes it when it expires",
                RELEASE_TIMEOUT_S,
            )

    async def _elect(self) -> None:
        """With leader election: campaign on the discovery's API client (readiness follows)."""
        lease = self.settings.leader_election
        if lease is None or not isinstance(self.discovery, KubernetesDiscovery):
            return
        self.elector = LeaderElector(
            self.discovery.api_client, lease, lambda leading: self.health.update(leader=leading)
        )
        self.elector.start()

    def _metrics_server(self) -> MetricsServer:
        settings = self.settings
        auth = None
        if settings.metrics_auth:
            if isinstance(self.discovery, KubernetesDiscovery):
                discovery = self.discovery
                auth = MetricsAuth(lambda: discovery.api_client)
            else:
                log.info("/metrics is served without authentication: endpoints do not come from Kubernetes")
        registry = self.metrics.registry
        return MetricsServer(
            lambda: generate_latest(registry),
            CONTENT_TYPE_LATEST,
            auth=auth,
            tls=metrics_tls(settings.metrics_cert_dir, settings.metrics_client_ca),
            routes={
                PLUGIN_STATE_PATH: state_handler(lambda: self.director.config.plugins),
                **(profiling_routes() if settings.pprof else {}),
            },
        )

    @property
    def metrics_bound_port(self) -> int:
        """The port /metrics listens on (the one asked for, or the one port 0 chose); 0: none."""
        return self.metrics_server.port if self.metrics_server is not None else 0

    async def stop(self) -> None:
        """Stop accepting (health NOT_SERVING), let requests in flight finish within the drain
        timeout, then close the rest."""
        drain = self.settings.drain_timeout
        fronts: list[Coroutine[Any, Any, None]] = []
        self.health.update(draining=True)
        if self.extproc is not None:
            fronts.append(self.extproc.stop(drain))
        if self.proxy is not None:
            fronts.append(self.proxy.stop(drain))
        if self.elector is not None:
            # released at once, beside the drain: a standby takes over while this one drains
            fronts.append(self._release_lease(self.elector))
        await asyncio.gather(*fronts)
        await self.director.close()
        if self.shared_state is not None:
            await self.shared_state.stop()
        await self.kv_events.stop()
        await self.catalog.stop()
        await self.scrapers.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        for task in list(self._background):
            task.cancel()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # the spans still queued go out
