"""The Go EPP's flags: every flag of llm-d-router's `cmd/epp` (at ebab687, and the ones added since:
`--feature-gates`, `--watch-config-file`, `--plugin-state-staleness-threshold`,
`--fairness-id-metric-label-limit` and the `--ha-*` Lease flags), the four GIE v1.5.0 flags
that llm-d-router dropped, controller-runtime's zap flags and `--v`, with upstream's names, kinds and
defaults (`pkg/epp/server/options.go`, `pkg/common/observability/logging/options.go`, controller-runtime
`pkg/log/zap/flags.go`); and the few flags that are epick's own.

`HOW` says what `epp` does with each: docs/deploy.md's table is written from it (a test checks they
agree).
"""

from __future__ import annotations

from epick.cli.goflags import FlagSpec

__all__ = ["DEPRECATED_METRIC_FLAGS", "EPICK_FLAGS", "FLAGS", "HOW", "UPSTREAM_FLAGS"]

S = 1.0  # a second, for durations

UPSTREAM_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("grpc-port", "int", 9002, "gRPC port used for communicating with Envoy proxy."),
    FlagSpec(
        "ha-enable-leader-election",
        "bool",
        False,
        "Enables leader election for high availability. When enabled, readiness probes will only pass "
        "on the leader.",
    ),
    FlagSpec(
        "drain-timeout",
        "duration",
        30 * S,
        "Graceful shutdown drain window: on SIGTERM, NOT_SERVING and the leader Lease released at once, "
        "then ext_proc keeps serving for up to this long.",
    ),
    FlagSpec(
        "grpc-max-recv-msg-size", "string", "", "Maximum size of a gRPC message to receive (e.g., 10MiB)."
    ),
    FlagSpec("grpc-max-send-msg-size", "string", "", "Maximum size of a gRPC message to send (e.g., 10MiB)."),
    FlagSpec(
        "pool-group",
        "string",
        "inference.networking.k8s.io",
        "Kubernetes resource group of the InferencePool this Endpoint Picker is associated with.",
    ),
    FlagSpec(
        "pool-namespace", "string", "", "Namespace of the InferencePool (default: $NAMESPACE, else default)."
    ),
    FlagSpec("pool-name", "string", "", "Name of the InferencePool this Endpoint Picker is associated with."),
    FlagSpec(
        "endpoint-selector",
        "string",
        "",
        "Selector to filter model server pods on (Kubernetes label selector syntax).",
    ),
    FlagSpec(
        "endpoint-target-ports",
        "intSlice",
        (),
        "Target ports of model server pods: comma-separated numbers without whitespace.",
    ),
    FlagSpec(
        "disable-endpoint-subset-filter",
        "bool",
        False,
        "Disables respecting the destination endpoint subset metadata for dispatching requests.",
    ),
    FlagSpec(
        "emit-endpoint-scores",
        "bool",
        False,
        "Emit the scheduler's per-endpoint scores in dynamic metadata (envoy.lb, "
        "x-gateway-destination-endpoint-scores).",
    ),
    FlagSpec("refresh-metrics-interval", "duration", 0.05, "Interval to refresh metrics."),
    FlagSpec(
        "refresh-prometheus-metrics-interval", "duration", 5 * S, "Interval to flush Prometheus metrics."
    ),
    FlagSpec(
        "metrics-staleness-threshold",
        "duration",
        2 * S,
        "Duration after which metrics are considered stale.",
    ),
    FlagSpec("total-queued-requests-metric", "string", "vllm:num_requests_waiting", "Deprecated."),
    FlagSpec("total-running-requests-metric", "string", "vllm:num_requests_running", "Deprecated."),
    FlagSpec("kv-cache-usage-percentage-metric", "string", "vllm:kv_cache_usage_perc", "Deprecated."),
    FlagSpec("lora-info-metric", "string", "vllm:lora_requests_info", "Deprecated."),
    FlagSpec("cache-info-metric", "string", "vllm:cache_config_info", "Deprecated."),
    FlagSpec("v", "int", 2, "Number for the log level verbosity.", shorthand="v"),
    FlagSpec("tracing", "bool", True, "Enables emitting traces."),
    FlagSpec("health-checking", "bool", False, "Enables health checking (on the ext_proc port)."),
    FlagSpec("metrics-port", "int", 9090, "The metrics port exposed by EPP."),
    FlagSpec("grpc-health-port", "int", 9003, "The port used for gRPC liveness and readiness probes."),
    FlagSpec("enable-pprof", "bool", True, "Enables pprof handlers."),
    FlagSpec(
        "cert-path",
        "string",
        "",
        "Directory with tls.crt and tls.key for secure serving; self-signed when unset.",
    ),
    FlagSpec("enable-cert-reload", "bool", False, "Enables reloading the certificates in --cert-path."),
    FlagSpec("enable-grpc-stream-metrics", "bool", False, "Enables ext_proc gRPC stream metrics."),
    FlagSpec("secure-serving", "bool", True, "Enables secure serving."),
    FlagSpec(
        "tls-min-version",
        "string",
        "",
        "Minimum TLS version for secure serving (VersionTLS12, VersionTLS13).",
    ),
    FlagSpec("tls-cipher-suites", "stringSlice", (), "TLS cipher suites for secure serving (Go names)."),
    FlagSpec(
        "metrics-endpoint-auth",
        "bool",
        True,
        "Enables authentication and authorization of the metrics endpoint.",
    ),
    FlagSpec(
        "metrics-client-ca-file", "string", "", "PEM CA for metrics mTLS: require verified client certs."
    ),
    FlagSpec(
        "metrics-cert-dir", "string", "", "Directory with the metrics server certificates (enables TLS)."
    ),
    FlagSpec("config-file", "string", "", "The path to the configuration file."),
    FlagSpec("config-text", "string", "", "The configuration specified as text, in lieu of a file."),
    FlagSpec("allow-experimental-plugins", "bool", False, "Allows loading of experimental Alpha plugins."),
    # Added upstream after ebab687 (llm-d-router pkg/epp/server/options.go, read from a later version).
    FlagSpec(
        "feature-gates",
        "stringSlice",
        (),
        "Comma-separated list of feature gates to enable or disable, in kubelet style (e.g., "
        "'flowControl=true'). A bare name enables the gate. Applied after the configuration's "
        "featureGates list, so these override entries set there.",
    ),
    FlagSpec(
        "watch-config-file",
        "bool",
        False,
        "Watches --config-file and reloads supported scheduling profile changes.",
    ),
    FlagSpec(
        "plugin-state-staleness-threshold",
        "duration",
        300 * S,
        "Inactivity duration after which a request's plugin state (e.g. in-flight load accounting) is "
        "reaped.",
    ),
    FlagSpec(
        "fairness-id-metric-label-limit",
        "int",
        1000,
        "Caps the number of distinct fairness_id label values recorded on metrics; values beyond the cap "
        "collapse to a single overflow series, and 0 collapses all of them.",
    ),
    FlagSpec(
        "ha-lease-name",
        "string",
        "",
        "Leader election Lease name (empty: epp-<pool-namespace>-<pool-name>.llm-d.ai).",
    ),
    FlagSpec("ha-lease-duration", "duration", 15 * S, "Leader election lease duration."),
    FlagSpec("ha-renew-deadline", "duration", 10 * S, "Leader election renew deadline."),
    FlagSpec("ha-retry-period", "duration", 2 * S, "Leader election retry period."),
    FlagSpec("zap-devel", "bool", True, "Development mode defaults (ignored, as upstream)."),
    FlagSpec("zap-encoder", "string", "", "Zap log encoding (one of 'json' or 'console')."),
    FlagSpec("zap-log-level", "string", "", "Zap level: debug, info, error, panic, or an integer > 0."),
    FlagSpec("zap-stacktrace-level", "string", "", "Zap level at and above which stacktraces are captured."),
    FlagSpec("zap-time-encoding", "string", "", "Zap time encoding (ignored, as upstream: epoch)."),
    # GIE v1.5.0's, dropped by llm-d-router (PR #1940); deprecated and hidden there.
    FlagSpec("model-server-metrics-scheme", "string", "http", "Deprecated (GIE v1.5.0)."),
    FlagSpec("model-server-metrics-path", "string", "/metrics", "Deprecated (GIE v1.5.0)."),
    FlagSpec("model-server-metrics-port", "int", 0, "Deprecated (GIE v1.5.0)."),
    FlagSpec("model-server-metrics-https-insecure-skip-verify", "bool", True, "Deprecated (GIE v1.5.0)."),
)

EPICK_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec(
        "proxy-port", "int", 0, "epick: also serve the OpenAI-compatible proxy on this port (0: no proxy)."
    ),
    FlagSpec(
        "workers",
        "int",
        1,
        "epick: at most this many worker processes, as many as the load needs (0: one per core of the "
        "container's CPU limit, at most the config allows, and 1 with no limit).",
    ),
    FlagSpec("min-workers", "int", 1, "epick: of --workers, how many always run."),
    FlagSpec(
        "idle-scrape-interval",
        "duration",
        0,
        "epick: scrape an endpoint that is idle and was sent nothing since its last scrape only this "
        "often (0: every --refresh-metrics-interval, as upstream).",
    ),
    FlagSpec("lease-duration", "duration", 15 * S, "epick: how long a leader's Lease holds without renewal."),
    FlagSpec(
        "lease-renew-deadline",
        "duration",
        10 * S,
        "epick: how long a leader tries to renew before it stops leading.",
    ),
    FlagSpec("lease-retry-period", "duration", 2 * S, "epick: how often the Lease is renewed or tried."),
    FlagSpec(
        "shared-state",
        "string",
        "",
        "epick: a redis:// (rediss:// with TLS) URL through which replicas share the approximate prefix "
        "index, the requests in flight and the LRU order (empty: each replica learns alone).",
    ),
)

FLAGS = UPSTREAM_FLAGS + EPICK_FLAGS

DEPRECATED_METRIC_FLAGS = (
    "total-queued-requests-metric",
    "total-running-requests-metric",
    "kv-cache-usage-percentage-metric",
    "lora-info-metric",
    "cache-info-metric",
)

# What epp does with each flag: "as upstream", or how it differs.
HOW: dict[str, str] = {
    "grpc-port": "as upstream",
    "ha-enable-leader-election": "as upstream: a Lease named epp-<namespace>-<pool>.llm-d.ai; one worker",
    "drain-timeout": "as upstream; ext_proc ends early once no stream is open",
    "grpc-max-recv-msg-size": "as upstream: the largest ext_proc message taken (default 4 MiB)",
    "grpc-max-send-msg-size": "accepted; epick's answers are small, so no limit is applied",
    "pool-group": "as upstream: the API group the InferencePool is read from",
    "pool-namespace": "as upstream",
    "pool-name": "as upstream",
    "endpoint-selector": "as upstream",
    "endpoint-target-ports": "as upstream",
    "disable-endpoint-subset-filter": "as upstream",
    "emit-endpoint-scores": "as upstream",
    "refresh-metrics-interval": "as upstream (at least 50 ms)",
    "refresh-prometheus-metrics-interval": "accepted; epick computes the pool gauges when /metrics is read",
    "metrics-staleness-threshold": "accepted; epick's staleness is the config's (utilization-detector)",
    "total-queued-requests-metric": "upstream refuses it (exit 1); epick warns and ignores it",
    "total-running-requests-metric": "upstream refuses it (exit 1); epick warns and ignores it",
    "kv-cache-usage-percentage-metric": "upstream refuses it (exit 1); epick warns and ignores it",
    "lora-info-metric": "upstream refuses it (exit 1); epick warns and ignores it",
    "cache-info-metric": "upstream refuses it (exit 1); epick warns and ignores it",
    "v": "as upstream: 4 and above logs DEBUG",
    "tracing": "as upstream: OpenTelemetry spans from the OTEL_* environment (docs/deploy.md)",
    "health-checking": "epick answers health on the ext_proc port always",
    "metrics-port": "as upstream",
    "grpc-health-port": "as upstream (plaintext)",
    "enable-pprof": "as upstream: /debug/pprof/ on the metrics port, in Python's terms (docs/deploy.md)",
    "cert-path": "as upstream",
    "enable-cert-reload": "as upstream",
    "enable-grpc-stream-metrics": "as upstream",
    "secure-serving": "as upstream",
    "tls-min-version": "as upstream (ext_proc): Go's names, VersionTLS10 to VersionTLS13",
    "tls-cipher-suites": "as upstream (ext_proc): Go's crypto/tls names, as OpenSSL's",
    "metrics-endpoint-auth": "as upstream: TokenReview, then SubjectAccessReview (with Kubernetes discovery)",
    "metrics-client-ca-file": "as upstream",
    "metrics-cert-dir": "as upstream (the pair re-read when it changes)",
    "config-file": "as upstream",
    "config-text": "as upstream",
    "allow-experimental-plugins": "as upstream: without it, a plugin upstream registers as Alpha is refused",
    "feature-gates": "as upstream: after the config's featureGates, the last word on a gate wins",
    "watch-config-file": "as upstream, and more: any change reloads, unchanged plugins keeping their state; "
    "a bad file keeps the running config",
    "plugin-state-staleness-threshold": "as upstream: in-flight accounting is reaped after this long",
    "fairness-id-metric-label-limit": 'as upstream: values past the cap share the fairness_id "other"',
    "ha-lease-name": "as upstream (overrides the derived name)",
    "ha-lease-duration": "as upstream (same as epick's --lease-duration)",
    "ha-renew-deadline": "as upstream (same as epick's --lease-renew-deadline)",
    "ha-retry-period": "as upstream (same as epick's --lease-retry-period)",
    "zap-devel": "ignored, as upstream",
    "zap-encoder": "json (upstream's only output); console gives text lines",
    "zap-log-level": "as upstream: overrides --v",
    "zap-stacktrace-level": "ignored, as upstream",
    "zap-time-encoding": "ignored, as upstream (epoch seconds)",
    "model-server-metrics-scheme": "GIE v1.5.0 only; warns and is ignored (the config's data layer says)",
    "model-server-metrics-path": "GIE v1.5.0 only; warns and is ignored (the config's data layer says)",
    "model-server-metrics-port": "GIE v1.5.0 only; warns and is ignored (the config's data layer says)",
    "model-server-metrics-https-insecure-skip-verify": "GIE v1.5.0 only; warns and is ignored",
    "proxy-port": "epick's own",
    "workers": "epick's own",
    "min-workers": "epick's own",
    "idle-scrape-interval": 'epick\'s own: quiet scraping (docs/performance.md, "Watching the fleet")',
    "lease-duration": "epick's own (upstream: controller-runtime's 15s, not settable)",
    "lease-renew-deadline": "epick's own (upstream: controller-runtime's 10s, not settable)",
    "lease-retry-period": "epick's own (upstream: controller-runtime's 2s, not settable)",
    "shared-state": "epick's own: active-active replicas sharing their state through Redis (docs/deploy.md)",
}


def go_duration(seconds: float) -> str:
    """`seconds` as Go's time.Duration prints itself: 50ms, 15s, 5m0s, 1h0m0s."""
    if seconds == 0:
        return "0s"
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 1:
        for unit, scale in (("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
            if seconds >= scale:
                return f"{sign}{seconds / scale:.9g}{unit}"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.9g}s"
    if hours or minutes:
        text = f"{int(minutes)}m{text}"
    if hours:
        text = f"{int(hours)}h{text}"
    return sign + text


def usage_default(spec: FlagSpec) -> str:
    """What `epp --help` prints after a flag's usage, as pflag does: nothing for a zero value (false,
    0, "", an empty list), else " (default …)" with strings quoted and durations in Go's form."""
    default = spec.default
    if default in (False, 0, "", ()) and not (spec.kind == "bool" and default is True):
        return ""
    if isinstance(default, bool):
        shown = "true"
    elif spec.kind == "duration" and isinstance(default, int | float):
        shown = go_duration(float(default))
    elif isinstance(default, tuple):
        shown = "[" + ",".join(map(str, default)) + "]"
    elif isinstance(default, str):
        shown = f'"{default}"'
    else:
        shown = str(default)
    return f" (default {shown})"


def flags_table() -> str:
    """docs/deploy.md's table of every flag: name, upstream's default, what epp does with it."""
    rows = ["| flag | default | epick |", "|---|---|---|"]
    for spec in FLAGS:
        default = spec.default
        if isinstance(default, bool):
            shown = str(default).lower()
        elif isinstance(default, tuple):
            shown = "[]" if not default else ",".join(map(str, default))
        elif spec.kind == "duration" and isinstance(default, float):
            shown = f"{default:g}s"
        else:
            shown = str(default) or '""'
        rows.append(f"| `--{spec.name}` | `{shown}` | {HOW[spec.name]} |")
    return "\n".join(rows) + "\n"
