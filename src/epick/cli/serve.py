"""`epick serve`: its flags, mapped onto the service's `Settings` (epick.service builds and runs it)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from epick.config import ConfigError
from epick.datalayer.datastore import EndpointSpec
from epick.datalayer.discovery.static import DiscoveryError, load_endpoints_file, parse_endpoints_flag
from epick.datalayer.health import OutlierPolicy
from epick.datalayer.rewrites import RewriteError
from epick.extproc.server import ExtProcOptions
from epick.extproc.tls import TlsFileError
from epick.plugins.duration import parse_duration
from epick.proxy.server import ProxyOptions
from epick.service import KubernetesSettings, Settings, SettingsError, serve

__all__ = ["add_parser", "run", "settings_from"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the endpoint picker as an OpenAI-compatible proxy")
    _discovery_flags(p)
    _front_end_flags(p)
    _limit_flags(p)
    _service_flags(p)
    p.set_defaults(func=run)


def _discovery_flags(p: argparse.ArgumentParser) -> None:
    """The config, and where the endpoints come from."""
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


def _front_end_flags(p: argparse.ArgumentParser) -> None:
    """The proxy and ext_proc: addresses, ports and TLS."""
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


def _limit_flags(p: argparse.ArgumentParser) -> None:
    """Scraping, /metrics, sizes, timeouts and outlier detection."""
    p.add_argument("--metrics-port", type=int, default=9090, help="epick's own /metrics (0: off)")
    p.add_argument("--refresh-metrics-interval", default="50ms", help="scrape interval per endpoint")
    p.add_argument(
        "--idle-scrape-interval",
        default="0s",
        help="scrape an endpoint that is idle (nothing running or waiting) and was sent nothing since "
        "its last scrape only this often; 0: every --refresh-metrics-interval, as upstream "
        "(epick.datalayer.scraper, quiet scraping)",
    )
    p.add_argument(
        "--metrics-staleness-threshold", default=None, help="metrics older than this count as saturated"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=16 * 1024 * 1024,
        help="largest request body (413 above), both front ends",
    )
    p.add_argument(
        "--max-bodies-bytes",
        type=int,
        default=None,
        help="request bodies held at once, each front end (503 past it; default 4 x --max-body-bytes; "
        "0: no limit)",
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
        help="502/503/504 answers or first-byte timeouts in a row that eject an endpoint (Envoy's default 5; "
        "0: no outlier "
        "detection, and ext_proc need not see response headers for it)",
    )
    p.add_argument(
        "--outlier-base-ejection", default="30s", help="first ejection; the n-th in a row lasts n times this"
    )
    p.add_argument("--outlier-max-ejection", default="300s", help="the longest ejection")


def _service_flags(p: argparse.ArgumentParser) -> None:
    """Objectives and rewrites, what is exposed and read, workers, draining and logging."""
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
        "--watch-config-file",
        action="store_true",
        help="reload --config-file when its content changes (as a ConfigMap update changes it); plugins "
        "whose configuration did not change keep their state, and a bad file keeps the running config",
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
        type=_workers,
        default=1,
        help="at most this many processes serve the proxy and ext_proc on the same ports, sharing the "
        "scheduling state (epick.service.workers): one more starts while those running are busy, and the "
        "last added retires when the load falls (--min-workers always run); default 1: one core relays "
        "hundreds of streamed requests a second, and each worker beyond it costs CPU and routing quality "
        "(docs/performance.md); 'auto': up to one per core available, or one where the config keeps state "
        "per process (flow control, plugins that do not share) or the gRPC ports are 0",
    )
    p.add_argument(
        "--min-workers",
        type=_workers_least,
        default=1,
        help="of --workers, how many always run (--min-workers N --workers N: a fixed count)",
    )
    p.add_argument(
        "--shared-state",
        metavar="URL",
        help="a Redis or Valkey URL (redis://, rediss:// with TLS, user and password in it) through which "
        "replicas on other hosts share the approximate prefix index, the requests in flight and the LRU "
        "order (epick.service.shared_state)",
    )
    p.add_argument(
        "--drain-timeout",
        default="10s",
        help="on SIGTERM: how long requests in flight may take to finish before connections close",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _workers_least(text: str) -> int:
    """`--min-workers`: a count of at least 1."""
    return _at_least_one(text, "min-workers", "a number of workers")


def _workers(text: str) -> int | None:
    """`--workers`: a count of at least 1, or "auto" (None: the service's choice)."""
    return None if text == "auto" else _at_least_one(text, "workers", "a number of workers or 'auto'")


def _at_least_one(text: str, flag: str, expected: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{flag} must be at least 1 (got {count})")
    return count


def _discovery(args: argparse.Namespace) -> tuple[tuple[EndpointSpec, ...], KubernetesSettings | None]:
    """The endpoints' source: a static list, Kubernetes, or neither (the config's discovery)."""
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
    if args.endpoints_file:
        return tuple(load_endpoints_file(args.endpoints_file)), None
    if args.endpoints:
        return tuple(parse_endpoints_flag(args.endpoints)), None
    if not sources[2]:
        return (), None  # the config's dataLayer.discovery (checked once the config is loaded)
    if args.pool_name and args.endpoint_selector:
        raise DiscoveryError("give --pool-name or --endpoint-selector, not both")
    ports = tuple(int(p) for p in args.endpoint_target_ports.split(",") if p.strip())
    return (), KubernetesSettings(
        namespace=args.pool_namespace or os.environ.get("NAMESPACE", "default"),
        pool=args.pool_name if not args.endpoint_selector else None,
        selector=args.endpoint_selector,
        target_ports=ports if args.endpoint_selector else (),
        kubeconfig=args.kubeconfig,
        watch_rewrites=args.watch_model_rewrites,
        watch_objectives=args.watch_objectives,
    )


def _proxy(args: argparse.Namespace) -> ProxyOptions | None:
    if args.no_proxy:
        return None
    return ProxyOptions(
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
    )


def _extproc(args: argparse.Namespace) -> ExtProcOptions | None:
    if args.no_extproc:
        return None
    return ExtProcOptions(
        host=args.host,
        port=args.grpc_port,
        health_port=args.grpc_health_port,
        secure=args.secure_serving,
        cert_path=args.cert_path,
        client_ca_path=args.client_ca_file,
        cert_reload=args.enable_cert_reload,
        health_plaintext=args.grpc_health_plaintext,
        max_streams=args.max_extproc_streams or None,
    )


def _objectives(items: list[str]) -> tuple[tuple[str, int], ...]:
    objectives = []
    for item in items:
        name, sep, priority = item.partition("=")
        if not sep or not name or not priority.lstrip("-").isdigit():
            raise ValueError(f"--objective {item!r}: expected NAME=PRIORITY with an integer priority")
        objectives.append((name, int(priority)))
    return tuple(objectives)


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings `epick serve`'s flags say; exits (status 2) naming a flag that is wrong."""
    try:
        endpoints, kubernetes = _discovery(args)
        staleness = args.metrics_staleness_threshold
        settings = Settings(
            endpoints=endpoints,
            kubernetes=kubernetes,
            config_file=args.config_file,
            proxy=_proxy(args),
            extproc=_extproc(args),
            metrics_port=args.metrics_port or None,
            metrics_host=args.host,
            refresh_metrics_interval=parse_duration(args.refresh_metrics_interval),
            idle_scrape_interval=parse_duration(args.idle_scrape_interval),
            metrics_staleness_threshold=parse_duration(staleness) if staleness else None,
            objectives=_objectives(args.objective),
            pool_name=args.pool_name or "epick",
            max_body_bytes=args.max_body_bytes,
            max_bodies_bytes=args.max_bodies_bytes,
            model_rewrites_file=args.model_rewrites,
            rewrites_pool=args.pool_name,
            outliers=OutlierPolicy(
                consecutive_failures=args.outlier_consecutive_5xx,
                base_ejection_s=parse_duration(args.outlier_base_ejection),
                max_ejection_s=parse_duration(args.outlier_max_ejection),
            ),
            usage_metrics=args.usage_metrics,
            workers=args.workers,
            min_workers=args.min_workers,
            shared_state=args.shared_state,
            watch_config_file=args.watch_config_file,
            drain_timeout=parse_duration(args.drain_timeout),
            log_level=args.log_level,
        )
        settings.check()
    except (DiscoveryError, ValueError) as e:
        raise SystemExit(f"epick serve: {e}") from None
    return settings


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = settings_from(args)
    try:
        serve(settings)
    except ConfigError as e:
        for issue in e.issues:
            print(issue.render(e.source), file=sys.stderr)
        return 2
    except (DiscoveryError, RewriteError, TlsFileError, SettingsError, OSError, ValueError) as e:
        print(f"epick serve: {e}", file=sys.stderr)
        return 2
    return 0
