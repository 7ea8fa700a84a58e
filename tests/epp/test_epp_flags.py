"""`epp`'s command line: exit statuses as upstream's, warnings naming what is ignored, TLS flags."""

from __future__ import annotations

import logging
import ssl

import pytest

from epick.cli.epp import EppError, _quantity, main, settings_from_flags
from epick.cli.epp_flags import FLAGS
from epick.cli.goflags import parse_go_flags
from epick.extproc.tls import GO_CIPHER_SUITES, cipher_string, tls_version


@pytest.fixture(autouse=True)
def _root_logger_restored() -> object:
    """`main` sets up logging as the process's (the root logger's level and handler): put it back."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def settings(*argv: str):  # type: ignore[no-untyped-def]
    return settings_from_flags(parse_go_flags(list(argv), FLAGS), environ={"NAMESPACE": "ns"})


def test_exit_statuses_are_upstreams(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert main(["--pool-name=p", "--no-such-flag"]) == 2
    assert "unknown flag: --no-such-flag" in capsys.readouterr().err
    assert main(["--pool-name=p", "--endpoint-selector=a=b"]) == 1  # flags that do not validate
    assert main(["--pool-name=p", "--zap-log-level=warn"]) == 2


def test_what_epick_ignores_is_named(caplog: pytest.LogCaptureFixture) -> None:
    from epick.cli.epp import warn_about

    flags = parse_go_flags(
        ["--pool-name", "p", "--secure-serving", "false", "--total-queued-requests-metric=x",
         "--model-server-metrics-path=/m"],
        FLAGS,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="epick.epp"):
        warn_about(flags)
    text = caplog.text
    assert "ignoring arguments that are not flags (as the Go EPP does): false" in text
    assert "flag --total-queued-requests-metric is deprecated" in text
    assert "flag --model-server-metrics-path is deprecated (GIE v1.5.0)" in text


def test_tls_flags_take_gos_names() -> None:
    suites = "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"
    s = settings("--pool-name=p", "--tls-min-version=VersionTLS13", f"--tls-cipher-suites={suites}")
    assert s.extproc is not None and s.extproc.tls_min_version == "VersionTLS13"
    assert tls_version("VersionTLS13") is ssl.TLSVersion.TLSv1_3
    assert (
        cipher_string(s.extproc.tls_cipher_suites)
        == "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384"
    )
    with pytest.raises(EppError, match=r"--tls-min-version: unknown TLS version 'TLS1\.3'"):
        settings("--pool-name=p", "--tls-min-version=TLS1.3")
    with pytest.raises(EppError, match="--tls-cipher-suites: unknown TLS cipher suite 'RC4'"):
        settings("--pool-name=p", "--tls-cipher-suites=RC4")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_ciphers(cipher_string(list(GO_CIPHER_SUITES)))  # OpenSSL knows every one


def test_sizes_are_kubernetes_quantities() -> None:
    assert _quantity("10MiB", "f") == 10 * 1024 * 1024
    assert _quantity("25MB", "f") == 25_000_000
    assert _quantity("1500m", "f") == 2  # milli, rounded up, as Quantity.Value()
    with pytest.raises(EppError, match="not a size"):
        _quantity("1g", "f")


def test_leader_election_runs_one_worker() -> None:
    assert settings("--pool-name=p", "--ha-enable-leader-election").workers == 1
    with pytest.raises(EppError, match="runs in one worker process"):
        settings("--pool-name=p", "--ha-enable-leader-election", "--workers=2")


def test_shared_state_is_epicks_own_flag() -> None:
    assert settings("--pool-name=p").shared_state is None
    assert (
        settings("--pool-name=p", "--shared-state=redis://redis:6379/1").shared_state
        == "redis://redis:6379/1"
    )


def test_the_flags_added_upstream_after_ebab687() -> None:
    s = settings(
        "--pool-name=p",
        "--feature-gates=flowControl,haPopulateNonLeaderDatastore=false",
        "--plugin-state-staleness-threshold=90s",
        "--fairness-id-metric-label-limit=0",
        "--config-file=/etc/epp/config.yaml",
        "--watch-config-file",
    )
    assert s.feature_gates == ("flowControl", "haPopulateNonLeaderDatastore=false")
    assert (s.plugin_state_staleness, s.fairness_id_label_limit, s.watch_config_file) == (90.0, 0, True)
    defaults = settings("--pool-name=p")
    assert (defaults.plugin_state_staleness, defaults.fairness_id_label_limit) == (300.0, 1000)
    with pytest.raises(EppError, match="unknown feature gate 'flowcontrol'"):
        settings("--pool-name=p", "--feature-gates=flowcontrol")
    with pytest.raises(EppError, match="'maybe' is not a valid value for feature gate 'flowControl'"):
        settings("--pool-name=p", "--feature-gates=flowControl=maybe")


def test_the_watch_and_staleness_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pool-name=p", "--watch-config-file"]) == 1  # needs --config-file
    assert main(["--pool-name=p", "--plugin-state-staleness-threshold=0s"]) == 1
    assert main(["--pool-name=p", "--fairness-id-metric-label-limit=-1"]) == 1


def test_upstreams_ha_flags_name_and_time_the_lease() -> None:
    lease = settings(
        "--pool-name=p", "--ha-enable-leader-election", "--ha-lease-name=my-lease",
        "--ha-lease-duration=30s", "--ha-renew-deadline=20s", "--ha-retry-period=5s",
    ).leader_election  # fmt: skip
    assert lease is not None
    assert (lease.name, lease.lease_duration, lease.renew_deadline, lease.retry_period) == (
        "my-lease", 30.0, 20.0, 5.0,
    )  # fmt: skip
    older = settings("--pool-name=p", "--ha-enable-leader-election", "--lease-duration=40s").leader_election
    assert older is not None and older.name == "epp-ns-p.llm-d.ai" and older.lease_duration == 40.0
    with pytest.raises(Exception, match=r"renew deadline must exceed 1.2 x the retry period"):
        settings(
            "--pool-name=p", "--ha-enable-leader-election", "--ha-renew-deadline=2.2s", "--ha-retry-period=2s"
        ).check()


def test_workers_and_quiet_scraping_are_epicks_own_flags() -> None:
    default = settings("--pool-name=p")
    assert default.workers == 1  # one worker unless asked (docs/performance.md, "Workers")
    assert default.idle_scrape_interval == 0.0  # upstream's scraping every interval
    assert settings("--pool-name=p", "--workers=3").workers == 3
    assert settings("--pool-name=p", "--idle-scrape-interval=1s").idle_scrape_interval == 1.0


def test_help_prints_defaults_as_pflag_does() -> None:
    from epick.cli.epp import usage
    from epick.cli.epp_flags import go_duration

    text = usage()
    assert "(default False)" not in text and "(default 0)" not in text and "(default '')" not in text
    lines = {line.split()[0]: line for line in text.splitlines()[1:]}
    assert lines["--refresh-metrics-interval"].endswith("(default 50ms)")
    assert lines["--secure-serving"].endswith("(default true)")
    assert lines["--pool-group"].endswith('(default "inference.networking.k8s.io")')
    assert not lines["--ha-enable-leader-election"].endswith(")")  # false: no default printed
    assert [go_duration(s) for s in (0, 0.05, 0.0015, 15, 300, 3661.5)] == [
        "0s", "50ms", "1.5ms", "15s", "5m0s", "1h1m1.5s",
    ]  # fmt: skip
