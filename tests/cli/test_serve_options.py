"""`epick serve`'s flags for how much of each response is read: usage metrics and outlier detection."""

from __future__ import annotations

from epick.cli.main import build_parser
from epick.cli.serve import settings_from
from epick.service import Settings


def options(*flags: str) -> Settings:
    return settings_from(build_parser().parse_args(["serve", "--endpoints", "127.0.0.1:8000", *flags]))


def test_usage_metrics_and_outlier_detection_are_on_by_default() -> None:
    o = options()
    assert o.usage_metrics is True
    assert o.outliers.consecutive_failures == 5 and o.outliers.counts_statuses


def test_both_can_be_turned_off() -> None:
    o = options("--no-usage-metrics", "--outlier-consecutive-5xx", "0")
    assert o.usage_metrics is False
    assert not o.outliers.counts_statuses


def test_shared_state_is_a_redis_url_and_each_settings_names_its_replica_group() -> None:
    assert options().shared_state is None
    o = options("--shared-state", "rediss://user:pw@redis:6380/2")
    assert o.shared_state == "rediss://user:pw@redis:6380/2"
    assert o.replica_id and o.replica_id != options().replica_id  # a pod's workers share the one pickled
