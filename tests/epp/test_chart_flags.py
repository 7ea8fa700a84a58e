"""Every EPP command line upstream's charts render makes epick's settings, with upstream's meaning."""

from __future__ import annotations

import pytest

from epick.cli.epp import settings_from_flags
from epick.cli.epp_flags import FLAGS
from epick.cli.goflags import parse_go_flags
from epick.config import ConfigError, LoadOptions, load_config_text
from tests.epp.charts import ChartPod, chart_pods

PODS = chart_pods()
# Configs mounted by charts that epick does not load, and why: each must still be refused with a message
# naming what is wrong.
KNOWN_REFUSED = {
    # a placeholder in the chart's README example, not a plugin anyone ships
    "router-gateway-readme-epp-example": "unknown plugin type 'custom-scorer'",
    # llm-d's newer guides set a parameter added to llm-d-router after ebab687 (issue 34)
    "guide-optimized-baseline-router-gateway": "unknown field 'maxTokensInFlightPenalty'",
    "guide-optimized-baseline-router-standalone": "unknown field 'maxTokensInFlightPenalty'",
    "guide-optimized-baseline-router-standalone-agentgateway": "unknown field 'maxTokensInFlightPenalty'",
}


def test_the_fixtures_cover_both_charts_and_the_guides() -> None:
    names = {pod.name for pod in PODS}
    assert len(PODS) >= 40
    assert {
        "gie-v1.5.0-default",
        "gie-v1.5.0-replicas2",
        "router-gateway-default",
        "router-standalone-default",
    } <= names
    assert sum(name.startswith("guide-") for name in names) >= 8


@pytest.mark.parametrize("pod", PODS, ids=lambda pod: pod.name)
def test_chart_arguments_make_settings_with_upstreams_meaning(pod: ChartPod) -> None:
    flags = parse_go_flags(pod.args, FLAGS)
    settings = settings_from_flags(flags, environ={"NAMESPACE": pod.namespace, "POD_NAME": pod.pod_name})
    settings.check()
    assert settings.proxy is None  # no path around the gateway
    extproc = settings.extproc
    assert extproc is not None
    assert extproc.port == pod.port("grpc")
    for kind in ("liveness", "readiness"):
        assert pod.probe(kind)[0] == extproc.health_port
    assert extproc.health_plaintext  # the kubelet's grpc probes speak plaintext
    assert extproc.host == ""  # every address family
    assert settings.metrics_port == pod.port("metrics")
    assert settings.kubernetes is not None and settings.kubernetes.wait_for_pool
    assert settings.kubernetes.namespace == pod.namespace
    assert settings.drain_timeout == 30.0
    elected = settings.leader_election is not None
    assert elected == (
        "--ha-enable-leader-election" in pod.args and "--ha-enable-leader-election=false" not in pod.args
    )
    if elected:
        assert settings.leader_election is not None
        assert settings.leader_election.namespace == pod.namespace
        assert settings.leader_election.name.startswith(f"epp-{pod.namespace}-")
        assert settings.leader_election.name.endswith(".llm-d.ai")
        assert settings.workers == 1
    # GIE renders a flags-map boolean as two arguments: pflag reads "--secure-serving" "false" as true
    # and a stray "false", and so does epick.
    assert extproc.secure == ("--secure-serving=false" not in pod.args)


@pytest.mark.parametrize("pod", PODS, ids=lambda pod: pod.name)
def test_the_config_each_chart_mounts_loads(pod: ChartPod) -> None:
    text = pod.config_text()
    assert text is not None
    refused = KNOWN_REFUSED.get(pod.name)
    if refused is None:
        # without --allow-experimental-plugins, as the charts run it: no Alpha plugin in these
        load_config_text(text, source=pod.config_path() or "", options=LoadOptions(allow_experimental=False))
        return
    with pytest.raises(ConfigError) as e:
        load_config_text(text, source=pod.config_path() or "")
    assert refused in str(e.value)


def test_an_alpha_plugin_needs_allow_experimental_plugins() -> None:
    text = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {name: sticky, type: session-affinity-filter}
- type: queue-scorer
"""
    with pytest.raises(ConfigError) as e:
        load_config_text(text, options=LoadOptions(allow_experimental=False))
    [issue] = e.value.issues
    assert issue.message == (
        "plugin 'sticky' (type: 'session-affinity-filter') has Alpha stability level, but command line flag "
        "--allow-experimental-plugins is not set"
    )
    load_config_text(text, options=LoadOptions(allow_experimental=True))
