"""`epp` (also `epick epp`): the Go EPP binary's contract, so that upstream's Helm charts run epick by
changing the image and nothing else.

It takes the command line `cmd/epp` takes (`epick.cli.epp_flags`, in pflag's syntax: `epick.cli.goflags`)
with upstream's defaults: ext_proc on 9002 with TLS (self-signed unless `--cert-path`), plaintext gRPC
health on 9003 answering the services upstream's probes ask for, /metrics on 9090, no OpenAI proxy, every
address family. A missing InferencePool or CRD leaves it running and unready, trying again; SIGTERM turns
readiness NOT_SERVING at once, releases the leader Lease and drains for `--drain-timeout`. Exit statuses
are upstream's: 2 for a command line pflag refuses, 1 for flags that do not validate, 0 for `--help`.
What it does with each flag is in `epp_flags.HOW` and docs/deploy.md.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic_core import PydanticCustomError

from epick.cli.epp_flags import DEPRECATED_METRIC_FLAGS, FLAGS, usage_default
from epick.cli.goflags import FlagError, GoFlags, HelpRequested, parse_go_flags
from epick.config import ConfigError
from epick.config.schema import check_feature_gate
from epick.datalayer.discovery.static import DiscoveryError
from epick.datalayer.rewrites import RewriteError
from epick.extproc.server import ExtProcOptions
from epick.extproc.tls import TlsFileError, cipher_string, tls_version
from epick.proxy.server import ProxyOptions
from epick.service import KubernetesSettings, Settings, SettingsError, serve
from epick.service.leader import LeaseSettings
from epick.service.logs import check_zap_log_level, configure_logging, python_level
from epick.service.workers import cores_available

__all__ = ["EppError", "main", "settings_from_flags"]

log = logging.getLogger("epick.epp")
T = TypeVar("T")

EXIT_USAGE = 2  # pflag: a command line it cannot parse
EXIT_INVALID = 1  # the EPP: flags that do not validate, or a failure while running
MIN_REFRESH_S = 0.05  # llm-d-router clamps --refresh-metrics-interval up to this
ALL_ADDRESSES = ""  # every address of every family (asyncio binds 0.0.0.0 and ::)
DEFAULT_GRPC_MESSAGE_BYTES = 4 * 1024 * 1024
# While draining: stop once no ext_proc stream has been open this long (the Go EPP always waits out
# --drain-timeout; an idle replica need not).
DRAIN_QUIET_S = 2.0
_DEPLOYMENT_OF_POD = re.compile(r"^(.+)-[a-z0-9]+-[a-z0-9]+$")
# A Kubernetes quantity's suffixes (resource.ParseQuantity): decimal SI, "m" being milli, and binary.
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)$")
_SUFFIX: dict[str, float] = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                             "P": 1e15, "E": 1e18}  # fmt: skip
_SUFFIX.update({f"{k}i": float(1024 ** (i + 1)) for i, k in enumerate("KMGTPE")})


class EppError(ValueError):
    """Flags that parse but do not make a service (upstream's Validate/Complete errors); exit 1."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        flags = parse_go_flags(args, FLAGS)
    except HelpRequested:
        print(usage(), file=sys.stderr)
        return 0
    except FlagError as e:
        print(f"{usage()}\n{e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        level = python_level(flags.integer("v"), check_zap_log_level(flags.text("zap-log-level")))
    except ValueError as e:
        print(f"invalid argument for --zap-log-level: {e}", file=sys.stderr)
        return EXIT_USAGE
    json_lines = flags.text("zap-encoder") != "console"
    configure_logging(level, json_lines=json_lines)
    warn_about(flags)
    try:
        settings = settings_from_flags(flags, environ=os.environ, log_format="json" if json_lines else "text")
    except (EppError, SettingsError, ValueError) as e:
        log.error("Failed to validate flags: %s", e)
        return EXIT_INVALID
    log.info("Flags processed: %s", " ".join(f"--{n}={flags[n]}" for n in sorted(flags.values)))
    try:
        serve(settings)
    except ConfigError as e:
        for issue in e.issues:
            log.error("%s", issue.render(e.source))
        return EXIT_INVALID
    except (DiscoveryError, RewriteError, TlsFileError, SettingsError, OSError, ValueError) as e:
        log.error("%s", e)
        return EXIT_INVALID
    return 0


def usage() -> str:
    lines = ["Usage of epp:"]
    for spec in FLAGS:
        shorthand = f"-{spec.shorthand}, " if spec.shorthand else "    "
        kind = "" if spec.kind == "bool" else f" {spec.kind}"
        lines.append(f"  {shorthand}--{spec.name}{kind}\t{spec.usage}{usage_default(spec)}")
    return "\n".join(lines)


def warn_about(flags: GoFlags) -> None:
    """One warning for each thing on the command line that epick ignores, naming it."""
    if flags.rest:
        log.warning("ignoring arguments that are not flags (as the Go EPP does): %s", " ".join(flags.rest))
    for name in DEPRECATED_METRIC_FLAGS:
        if flags.was_given(name):
            log.warning(
                "flag --%s is deprecated: configure metrics via engineConfigs in EndpointPickerConfig "
                "instead (the Go EPP refuses it; epick ignores it)",
                name,
            )
    for name in [n for n in flags.given if n.startswith("model-server-metrics-")]:
        log.warning(
            "flag --%s is deprecated (GIE v1.5.0) and ignored: configure the metrics data source's "
            "parameters in the config instead",
            name,
        )


def settings_from_flags(
    flags: GoFlags, *, environ: os._Environ[str] | dict[str, str], log_format: str = "json"
) -> Settings:
    """The service's settings for a parsed `epp` command line (raises `EppError` naming a bad flag)."""
    pool, selector = flags.text("pool-name"), flags.text("endpoint-selector")
    if pool and selector:
        raise EppError("--pool-name and --endpoint-selector are mutually exclusive")
    if flags.text("config-file") and flags.text("config-text"):
        raise EppError("--config-file and --config-text are mutually exclusive")
    ports = tuple(dict.fromkeys(flags.integers("endpoint-target-ports")))
    if selector and not 1 <= len(ports) <= 8:
        raise EppError("--endpoint-target-ports: give 1 to 8 ports with --endpoint-selector")
    if any(not 0 < p < 65536 for p in ports):
        raise EppError(f"--endpoint-target-ports: {ports} has a port outside 1..65535")
    namespace = flags.text("pool-namespace") or environ.get("NAMESPACE") or "default"
    kubernetes = None
    if pool or selector:
        kubernetes = KubernetesSettings(
            namespace=namespace,
            pool=pool or None,
            selector=selector or None,
            target_ports=ports if selector else (),
            pool_group=flags.text("pool-group") if pool else None,
            wait_for_pool=True,
        )
    elif not (flags.text("config-file") or flags.text("config-text")):
        raise EppError(
            "give --pool-name or --endpoint-selector (or a config whose dataLayer names a discovery)"
        )
    refresh = flags.number("refresh-metrics-interval")
    if refresh < MIN_REFRESH_S:
        log.warning("--refresh-metrics-interval %gs is below the minimum; clamped to 50ms", refresh)
        refresh = MIN_REFRESH_S
    proxy_port = flags.integer("proxy-port")
    return Settings(
        kubernetes=kubernetes,
        config_file=flags.text("config-file") or None,
        config_text=flags.text("config-text") or None,
        proxy=ProxyOptions(host=ALL_ADDRESSES, port=proxy_port) if proxy_port else None,
        extproc=ExtProcOptions(
            host=ALL_ADDRESSES,
            port=flags.integer("grpc-port"),
            health_port=flags.integer("grpc-health-port"),
            secure=flags.boolean("secure-serving"),
            cert_path=flags.text("cert-path") or None,
            cert_reload=flags.boolean("enable-cert-reload"),
            health_plaintext=True,
            drain_quiet=DRAIN_QUIET_S,
            stream_metrics=flags.boolean("enable-grpc-stream-metrics"),
            tls_min_version=_checked(tls_version, flags.text("tls-min-version"), "tls-min-version"),
            tls_cipher_suites=_checked(
                cipher_string, flags.strings("tls-cipher-suites"), "tls-cipher-suites"
            ),
            max_message_bytes=_quantity(flags.text("grpc-max-recv-msg-size"), "grpc-max-recv-msg-size")
            or DEFAULT_GRPC_MESSAGE_BYTES,
        ),
        metrics_port=flags.integer("metrics-port") or None,
        metrics_host=ALL_ADDRESSES,
        metrics_auth=flags.boolean("metrics-endpoint-auth"),
        metrics_cert_dir=_existing_pair(flags.text("metrics-cert-dir")),
        metrics_client_ca=flags.text("metrics-client-ca-file") or None,
        pprof=flags.boolean("enable-pprof"),
        tracing=flags.boolean("tracing"),
        refresh_metrics_interval=refresh,
        idle_scrape_interval=flags.number("idle-scrape-interval"),
        pool_name=pool or "epick",
        workers=epp_workers(
            flags.integer("workers"),
            leader_election=flags.boolean("ha-enable-leader-election"),
            least=flags.integer("min-workers"),
        ),
        min_workers=flags.integer("min-workers"),
        drain_timeout=flags.number("drain-timeout"),
        shared_state=flags.text("shared-state") or None,
        log_level=logging.getLevelName(logging.getLogger().level).lower(),
        log_format=log_format,
        leader_election=_lease(flags, namespace, environ)
        if flags.boolean("ha-enable-leader-election")
        else None,
        subset_filter=not flags.boolean("disable-endpoint-subset-filter"),
        emit_endpoint_scores=flags.boolean("emit-endpoint-scores"),
        allow_experimental_plugins=flags.boolean("allow-experimental-plugins"),
        feature_gates=_feature_gates(flags.strings("feature-gates")),
        plugin_state_staleness=flags.number("plugin-state-staleness-threshold"),
        fairness_id_label_limit=flags.integer("fairness-id-metric-label-limit"),
        watch_config_file=flags.boolean("watch-config-file"),
    )


def epp_workers(asked: int, *, leader_election: bool, least: int = 1) -> int | None:
    """The most worker processes: as asked; else bounded by the container's CPU limit (None: the
    service's default up to it), and one where there is no limit (the node's cores are not this
    pod's) or with leader election (one replica, one Lease holder). `least`: `--min-workers`."""
    if asked < 0:
        raise EppError(f"--workers must be at least 0 (got {asked})")
    if leader_election:
        if asked > 1 or least > 1:
            flag = "--workers" if asked > 1 else "--min-workers"
            raise EppError(f"--ha-enable-leader-election runs in one worker process: give {flag} 1 or none")
        return 1
    if asked:
        return asked
    if not _has_cpu_limit():
        return 1
    return None if cores_available() > 1 else 1


def _has_cpu_limit() -> bool:
    from epick.service.workers.count import CGROUP_ROOT

    try:
        limit = (CGROUP_ROOT / "cpu.max").read_text().split()[0]
        return limit != "max"
    except (OSError, IndexError):
        pass
    try:
        return int((CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").read_text()) > 0
    except (OSError, ValueError):
        return False


def _lease(flags: GoFlags, namespace: str, environ: os._Environ[str] | dict[str, str]) -> LeaseSettings:
    """The Lease upstream elects on: `epp-<namespace>-<pool>.llm-d.ai`; with a selector, the EPP's
    Deployment (from $POD_NAME) stands in for the pool."""
    name = flags.text("pool-name")
    if not name:
        pod = environ.get("POD_NAME", "")
        if not pod:
            raise EppError("leader election with --endpoint-selector needs $POD_NAME (the chart sets it)")
        match = _DEPLOYMENT_OF_POD.match(pod)
        if match is None:
            raise EppError(f"$POD_NAME {pod!r} is not a Deployment's pod name")
        name = match.group(1)

    def timing(upstream: str, own: str) -> float:
        """Upstream's `--ha-*` flag where given, else epick's older name for it."""
        return flags.number(upstream if flags.was_given(upstream) or not flags.was_given(own) else own)

    return LeaseSettings(
        name=flags.text("ha-lease-name") or f"epp-{namespace}-{name}.llm-d.ai",
        namespace=namespace,
        lease_duration=timing("ha-lease-duration", "lease-duration"),
        renew_deadline=timing("ha-renew-deadline", "lease-renew-deadline"),
        retry_period=timing("ha-retry-period", "lease-retry-period"),
    )


def _checked(check: Callable[[Any], object], value: T, flag: str) -> T:
    """`value` once `check` takes it (an empty one as it is); `EppError` naming the flag if not."""
    if value:
        try:
            check(value)
        except ValueError as e:
            raise EppError(f"--{flag}: {e}") from None
    return value


def _existing_pair(cert_dir: str) -> str | None:
    """`--metrics-cert-dir`, which must hold tls.crt and tls.key (upstream refuses to start otherwise)."""
    if not cert_dir:
        return None
    from pathlib import Path

    missing = [name for name in ("tls.crt", "tls.key") if not (Path(cert_dir) / name).is_file()]
    if missing:
        raise EppError(f"--metrics-cert-dir {cert_dir}: {' and '.join(missing)} cannot be read")
    return cert_dir


def _quantity(text: str, flag: str) -> int:
    """Bytes from a Kubernetes quantity with an optional trailing B ("10MiB", "25MB", "1024"); 0: unset."""
    text = text.strip()
    if not text:
        return 0
    if len(text) > 1 and text[-1] in "Bb":
        text = text[:-1]
    match = _QUANTITY.match(text)
    if match is None:
        raise EppError(f"invalid --{flag}: {text!r} is not a size (write it like 10MiB or 25MB)")
    return math.ceil(float(match.group(1)) * _SUFFIX[match.group(2)])  # as Quantity.Value(): rounded up


def _feature_gates(entries: Sequence[str]) -> tuple[str, ...]:
    """`--feature-gates` entries, kubelet style ("flowControl", "flowControl=false"), each checked as
    a config's featureGates entry is (an unknown gate or a value that is not a boolean is an error)."""
    checked = []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        try:
            check_feature_gate(entry)
        except PydanticCustomError as e:
            raise EppError(f"--feature-gates: {e.context['message'] if e.context else e}") from None
        checked.append(entry)
    return tuple(checked)


if __name__ == "__main__":
    sys.exit(main())
