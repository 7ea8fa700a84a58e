"""`data-parallel-profile-handler` and `header-profile-handler`, against upstream's documented
behaviour (llm-d-router's dp_profile_handler.go and header_profile_handler.go)."""

from __future__ import annotations

import textwrap

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import SchedulingError
from epick.plugins.profile.data_parallel import DataParallelProfileHandler
from epick.plugins.profile.header import HeaderProfileHandler
from epick.plugins.scorers.queue import QueueScorer
from tests.builders import make_endpoint, make_profile, make_request, make_scheduler

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def ranks() -> list:  # type: ignore[type-arg]
    # One pod, three data-parallel ranks on ports 8000..8002; rank 2 has the shortest queue.
    return [
        make_endpoint("pod-rank-0", address="10.0.0.5", port=8000, queue=3),
        make_endpoint("pod-rank-1", address="10.0.0.5", port=8001, queue=2),
        make_endpoint("pod-rank-2", address="10.0.0.5", port=8002, queue=0),
    ]


def test_data_parallel_sends_to_the_primary_port_naming_the_rank() -> None:
    scheduler = make_scheduler(
        make_profile("default", scorers=[(QueueScorer(), 1.0)]), handler=DataParallelProfileHandler()
    )
    result = scheduler.schedule(make_request(), ranks())
    (target,) = result.targets
    assert (target.name, target.host_port) == ("pod-rank-2", "10.0.0.5:8000")
    assert result.headers == {"x-data-parallel-host-port": "10.0.0.5:8002"}


def test_data_parallel_needs_exactly_one_profile() -> None:
    scheduler = make_scheduler(make_profile("a"), make_profile("b"), handler=DataParallelProfileHandler())
    with pytest.raises(SchedulingError, match="requires exactly one scheduling profile, the config has 2"):
        scheduler.schedule(make_request(), ranks())


def test_data_parallel_primary_port_range() -> None:
    config = load_config_text(
        HEADER + "plugins:\n- type: data-parallel-profile-handler\n  parameters: {primaryPort: 9000}\n"
    )
    handler = config.scheduler.handler
    assert isinstance(handler, DataParallelProfileHandler) and handler.primary_port == 9000
    with pytest.raises(ConfigError) as info:
        load_config_text(
            HEADER + "plugins:\n- type: data-parallel-profile-handler\n  parameters: {primaryPort: 70000}\n"
        )
    assert info.value.issues[0].path == "plugins[0].parameters.primaryPort"


def two_profiles(handler: HeaderProfileHandler):  # type: ignore[no-untyped-def]
    return make_scheduler(make_profile("decode"), make_profile("batch"), handler=handler)


def test_header_profile_handler_runs_the_profile_the_header_names() -> None:
    scheduler = two_profiles(HeaderProfileHandler())
    eps = [make_endpoint("a")]
    assert (
        scheduler.schedule(make_request(headers={"epp-profile": " batch "}), eps).primary_profile == "batch"
    )
    assert scheduler.schedule(make_request(), eps).primary_profile == "decode"  # defaultProfile


def test_header_profile_handler_errors_name_the_value() -> None:
    scheduler = two_profiles(HeaderProfileHandler(header_name="X-Tier", default_profile="none"))
    eps = [make_endpoint("a")]
    with pytest.raises(SchedulingError, match="for 'x-tier' header value 'gold'"):
        scheduler.schedule(make_request(headers={"x-tier": "gold"}), eps)
    with pytest.raises(SchedulingError, match="defaultProfile 'none' is not a configured scheduling profile"):
        scheduler.schedule(make_request(), eps)


def test_header_profile_handler_with_one_profile_ignores_the_header() -> None:
    scheduler = make_scheduler(make_profile("only"), handler=HeaderProfileHandler())
    assert (
        scheduler.schedule(make_request(headers={"epp-profile": "x"}), [make_endpoint("a")]).primary_profile
        == "only"
    )


def test_header_profile_handler_from_config() -> None:
    config = load_config_text(
        HEADER
        + textwrap.dedent(
            """\
            plugins:
            - type: header-profile-handler
              parameters: {headerName: X-Route, defaultProfile: fast}
            - type: queue-scorer
            schedulingProfiles:
            - name: fast
              plugins: [{pluginRef: queue-scorer}]
            - name: slow
              plugins: [{pluginRef: queue-scorer}]
            """
        )
    )
    handler = config.scheduler.handler
    assert isinstance(handler, HeaderProfileHandler)
    assert (handler.header_name, handler.default_profile) == ("x-route", "fast")
