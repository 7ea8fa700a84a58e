"""The service's settings: one typed object that says everything a running epick is built from.

Command lines map onto it (`epick serve`'s flags, in `epick.cli.serve`); a program or a test builds
one directly. It is plain data: frozen, picklable (the supervisor hands it to its worker processes),
and checked by `Settings.check`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from epick.datalayer.datastore import EndpointSpec
from epick.datalayer.health import OutlierPolicy
from epick.extproc.server import ExtProcOptions
from epick.proxy.server import ProxyOptions
from epick.service.leader import LeaseSettings

__all__ = ["KubernetesSettings", "Settings", "SettingsError"]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class SettingsError(ValueError):
    """Settings that cannot make a service; the message names the setting and what is wrong."""


@dataclass(frozen=True, slots=True)
class WorkerScaling:
    """The thresholds of load-following workers (`epick.service.workers.scaling` says what each does)."""

    up_cpu: float = 0.6
    down_cpu: float = 0.25
    sample_s: float = 1.0
    up_samples: int = 3
    down_samples: int = 30
    settle_s: float = 5.0

    def check(self) -> None:
        """Raise ValueError naming a threshold that cannot work."""
        if self.sample_s <= 0:
            raise ValueError(f"worker scaling: the sample period must be positive (got {self.sample_s:g}s)")
        if self.settle_s < 0:
            raise ValueError(f"worker scaling: the settle time cannot be negative (got {self.settle_s:g}s)")
        if self.up_samples < 1 or self.down_samples < 1:
            raise ValueError("worker scaling: up_samples and down_samples must be at least 1")
        if not 0 <= self.down_cpu < self.up_cpu:
            raise ValueError(
                f"worker scaling: down_cpu ({self.down_cpu:g}) must be below up_cpu ({self.up_cpu:g})"
            )


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """Endpoints from a cluster: an InferencePool's pods, or the pods a label selector matches."""

    namespace: str
    pool: str | None = None
    selector: str | None = None
    target_ports: tuple[int, ...] = ()
    kubeconfig: str | None = None
    # With a pool: watch the InferenceModelRewrites whose poolRef names it (beside any rewrites file).
    watch_rewrites: bool = True
    # With a pool: watch its InferenceObjectives (objective name -> priority, beside `objectives`).
    watch_objectives: bool = True
    # A pool or CRD that is missing, or an API server that cannot be reached, at start: False, the
    # service does not start (`epick serve`); True, it starts unready and tries again (`epp`, as the Go
    # EPP stays up).
    wait_for_pool: bool = False
    # The InferencePool's API group (`--pool-group`); None: inference.networking.k8s.io, then the older
    # inference.networking.x-k8s.io.
    pool_group: str | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """What to serve, from where, and how.

    Endpoints come from one of `endpoints` (a static list), `kubernetes`, or the config's
    `dataLayer.discovery`. A front end set to None does not run; a port of 0 is chosen by the kernel.
    """

    endpoints: tuple[EndpointSpec, ...] = ()
    kubernetes: KubernetesSettings | None = None
    config_file: str | None = None  # None: `config_text`, else the built-in default config
    config_text: str | None = None  # the config itself (`epp --config-text`)
    proxy: ProxyOptions | None = field(default_factory=ProxyOptions)
    extproc: ExtProcOptions | None = None
    metrics_port: int | None = 9090  # epick's own /metrics; None: not served
    metrics_host: str = "0.0.0.0"
    # /metrics behind TokenReview and SubjectAccessReview (`--metrics-endpoint-auth`; with Kubernetes
    # discovery only, as upstream), over TLS from a directory with tls.crt and tls.key, client
    # certificates required with a CA.
    metrics_auth: bool = False
    metrics_cert_dir: str | None = None
    metrics_client_ca: str | None = None
    # The profiling endpoints (`/debug/pprof/*`) on the metrics port (`--enable-pprof`).
    pprof: bool = False
    # OpenTelemetry spans for each request (`--tracing`), set up from the OTEL_* environment.
    tracing: bool = False
    refresh_metrics_interval: float = 0.05
    # Quiet scraping (epick.datalayer.scraper): an idle endpoint sent nothing since its last scrape is
    # scraped only this often; 0: every refresh interval, as upstream.
    idle_scrape_interval: float = 0.0
    metrics_staleness_threshold: float | None = None
    objectives: tuple[tuple[str, int], ...] = ()  # objective name -> priority
    pool_name: str = "epick"  # the metrics' pool label
    seed: int | None = None
    # Both front ends refuse larger request bodies with 413; None: the proxy's limit (or its default).
    max_body_bytes: int | None = None
    # The request bodies both front ends hold at once, each over its connections: a body past it is
    # answered 503. None: four times the body limit; 0: no limit.
    max_bodies_bytes: int | None = None
    # InferenceModelRewrite resources (YAML); those whose poolRef names another pool than
    # `rewrites_pool` are skipped.
    model_rewrites_file: str | None = None
    rewrites_pool: str | None = None
    outliers: OutlierPolicy = field(default_factory=OutlierPolicy)
    # The token histograms from each response's usage; off, responses are read only when a plugin
    # needs them (and ext_proc asks the gateway for less of each response).
    usage_metrics: bool = True
    # Worker processes (`epick.service.workers`); None ("auto"): one per core available, or one where
    # splitting would change the service.
    workers: int | None = 1
    # Of those, how many always run (`--min-workers`); the rest start while the running ones are busy
    # and retire when the load falls (`epick.service.workers.scaling`, with these thresholds).
    min_workers: int = 1
    worker_scaling: WorkerScaling = field(default_factory=WorkerScaling)
    # `--shared-state`: a Redis or Valkey URL through which replicas on other hosts share the replicated
    # plugins' state (`epick.service.shared_state`); None: each replica (each pod) learns alone.
    shared_state: str | None = None
    # This process group's name among the replicas sharing state (one per pod: the workers share it).
    replica_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # On stop: how long requests in flight may take to finish before their connections are closed.
    drain_timeout: float = 10.0
    # The log level worker processes set up (a single process leaves logging to its caller).
    log_level: str = "info"
    log_format: str = "text"  # or "json": zap's JSON lines, as the Go EPP writes them
    # Honour the gateway's endpoint subset hint (`envoy.lb.subset_hint` metadata): pick only among the
    # endpoints it names. False: `--disable-endpoint-subset-filter`.
    subset_filter: bool = True
    # Report each candidate's score in the routing's dynamic metadata (`--emit-endpoint-scores`).
    emit_endpoint_scores: bool = False
    # False: a config with a plugin upstream registers as Alpha is refused (`epp` without
    # --allow-experimental-plugins); `epick serve` loads every plugin epick has.
    allow_experimental_plugins: bool = True
    # `--feature-gates`: entries applied after the config's featureGates (the last word wins).
    feature_gates: tuple[str, ...] = ()
    # `--plugin-state-staleness-threshold`: a request's in-flight accounting is reaped after this long.
    plugin_state_staleness: float = 300.0
    # `--fairness-id-metric-label-limit`: distinct fairness_id label values on /metrics; past it they
    # share the series "other" (0: every value does).
    fairness_id_label_limit: int = 1000
    # `--watch-config-file`: reload the config file when its content changes (a ConfigMap update).
    watch_config_file: bool = False
    # Active-passive HA (`--ha-enable-leader-election`): readiness is SERVING only on the replica that
    # holds this Lease. None: no leader election.
    leader_election: LeaseSettings | None = None

    @property
    def body_limit(self) -> int:
        """The largest request body either front end takes."""
        if self.max_body_bytes:
            return self.max_body_bytes
        return self.proxy.max_body_bytes if self.proxy else DEFAULT_MAX_BODY_BYTES

    @property
    def bodies_limit(self) -> int:
        """The request-body bytes each front end holds at once (0: no limit)."""
        if self.max_bodies_bytes is None:
            return 4 * self.body_limit
        return self.max_bodies_bytes

    @property
    def grpc_ports_fixed(self) -> bool:
        """Whether ext_proc's ports can be shared by workers: no ext_proc, or neither port 0."""
        return self.extproc is None or 0 not in (self.extproc.port, self.extproc.health_port)

    def _check_workers(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise SettingsError(f"workers must be at least 1 (got {self.workers})")
        if self.min_workers < 1:
            raise SettingsError(f"min-workers must be at least 1 (got {self.min_workers})")
        if self.workers is not None and self.min_workers > self.workers:
            raise SettingsError(f"min-workers ({self.min_workers}) is above workers ({self.workers})")
        try:
            self.worker_scaling.check()
        except ValueError as e:
            raise SettingsError(str(e)) from None

    def check(self) -> None:
        """Raise `SettingsError` naming the first setting that cannot work."""
        if self.shared_state is not None:
            scheme = self.shared_state.partition("://")[0] if "://" in self.shared_state else ""
            if scheme not in ("redis", "rediss", "unix", "valkey", "valkeys"):
                raise SettingsError(
                    f"shared state {self.shared_state!r}: give a redis://, rediss:// (TLS), unix://, "
                    "valkey:// or valkeys:// URL"
                )
        k8s = self.kubernetes
        if self.endpoints and k8s is not None:
            raise SettingsError("give static endpoints or Kubernetes discovery, not both")
        if k8s is not None and bool(k8s.pool) == bool(k8s.selector):
            raise SettingsError("Kubernetes discovery needs an InferencePool name or a label selector (one)")
        self._check_workers()
        if self.refresh_metrics_interval <= 0:
            raise SettingsError(
                f"the metrics refresh interval must be positive (got {self.refresh_metrics_interval})"
            )
        if self.idle_scrape_interval < 0 or 0 < self.idle_scrape_interval < self.refresh_metrics_interval:
            raise SettingsError(
                f"the idle scrape interval must be 0 (off) or at least the refresh interval "
                f"{self.refresh_metrics_interval:g}s (got {self.idle_scrape_interval:g}s)"
            )
        if self.leader_election is not None:
            if self.workers is not None and self.workers > 1:
                raise SettingsError("leader election runs in one process: give one worker")
            if k8s is None:
                raise SettingsError("leader election needs Kubernetes (an InferencePool or a selector)")
            try:
                self.leader_election.check()
            except ValueError as e:
                raise SettingsError(str(e)) from None
        if self.metrics_client_ca and not self.metrics_cert_dir:
            raise SettingsError('"metrics-client-ca-file" requires "metrics-cert-dir"')
        if self.metrics_cert_dir and not (self.metrics_client_ca or self.metrics_auth):
            raise SettingsError(
                '"metrics-cert-dir" enables metrics TLS without authentication; set "metrics-client-ca-file" '
                'or "metrics-endpoint-auth"'
            )
        if self.config_file and self.config_text:
            raise SettingsError("give a config file or a config text, not both")
        if self.watch_config_file and not self.config_file:
            raise SettingsError('flag "watch-config-file" requires "config-file"')
        if self.plugin_state_staleness <= 0:
            raise SettingsError(
                f"plugin-state-staleness-threshold must be positive, got {self.plugin_state_staleness:g}s"
            )
        if self.fairness_id_label_limit < 0:
            raise SettingsError(
                f"fairness-id-metric-label-limit must be non-negative, got {self.fairness_id_label_limit}"
            )
        if self.log_format not in ("text", "json"):
            raise SettingsError(f"the log format is text or json (got {self.log_format!r})")
        if self.drain_timeout < 0:
            raise SettingsError(f"the drain timeout cannot be negative (got {self.drain_timeout})")
        if self.workers is not None and self.workers > 1:
            if self.proxy is None and self.extproc is None:
                raise SettingsError("workers above 1 need the proxy or ext_proc to serve")
            if not self.grpc_ports_fixed:
                raise SettingsError("workers above 1 share the gRPC ports between them: give fixed ports")
