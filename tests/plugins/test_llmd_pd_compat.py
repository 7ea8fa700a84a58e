"""llm-d's P/D config files load unchanged: `pd-profile-handler` (both its parameter forms),
`prefill-header-handler` / `disagg-headers-handler`, and the prefix scorer's `hashBlockSize`."""

from __future__ import annotations

import re

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState, Endpoint
from epick.plugins.prefix.scorer import PrefixCacheScorer, PrefixMatch
from epick.plugins.profile.deciders import AlwaysDisaggDecider
from epick.plugins.profile.pd import PdProfileHandler, ThresholdRule
from tests.builders import make_endpoint, make_request

# As llm-d's examples write it (pd-config.yaml of its guides): prefill past 10 uncached bytes.
LLMD_PD = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-header-handler
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 5
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: pd-profile-handler
  parameters:
    threshold: 10
    hashBlockSize: 5
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 50
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 50
"""


def pool() -> list[Endpoint]:
    return [
        make_endpoint("d1", role="decode", address="10.0.0.1"),
        make_endpoint("p1", role="prefill", address="10.0.0.2"),
    ]


def test_llmd_pd_config_loads_and_disaggregates_until_the_decode_endpoint_holds_the_prompt() -> None:
    config = load_config_text(LLMD_PD, seed=1)
    handler = config.scheduler.handler
    assert isinstance(handler, PdProfileHandler)
    assert isinstance(handler.decider, ThresholdRule)
    assert (handler.decider.threshold, handler.decider.block_bytes) == (10, 5)
    prefix = config.plugins["prefix-cache-scorer"]
    assert isinstance(prefix, PrefixCacheScorer) and prefix.block_bytes == 5

    first = make_request("abcde" * 8)  # 40 bytes, nothing cached: 40 >= 10 -> prefill on p1
    cycle_state = CycleState()
    result = config.scheduler.schedule(first, pool(), cycle_state=cycle_state)
    assert result.primary_profile == "decode" and result.prefill_profile == "prefill"
    assert [ep.name for ep in result.targets] == ["d1"]
    assert result.prefill is not None and result.prefill.name == "p1"
    for hook in config.hooks.pre_request:
        hook.pre_request(first, result, cycle_state)

    # The same prompt plus 5 bytes: d1 holds 8 blocks of 5 (40 bytes): 45 - 40 = 5 < 10 -> decode only.
    again = make_request("abcde" * 8 + "fghij")
    result = config.scheduler.schedule(again, pool())
    assert list(result.profile_results) == ["decode"]
    assert result.prefill is None


@pytest.mark.parametrize(
    ("threshold", "prompt_bytes", "matched_on_d", "expected"),
    [
        (0, 0, 0, True),  # threshold 0: always
        (0, 500, 100, True),
        (100, 99, 0, False),  # 99 uncached < 100
        (100, 100, 0, True),  # 100 >= 100
        (100, 640, 8, True),  # 640 - 8 * 64 = 128 >= 100
        (100, 640, 9, False),  # 640 - 576 = 64 < 100
    ],
)
def test_threshold_rule(threshold: int, prompt_bytes: int, matched_on_d: int, expected: bool) -> None:
    rule = ThresholdRule(threshold, 64, "prefix-cache-scorer")
    cycle_state = CycleState()
    cycle_state.write(
        "prefix-cache-scorer/prefix-cache-scorer",
        PrefixMatch(-(-prompt_bytes // 64), 64, {"d": matched_on_d} if matched_on_d else {}),
    )
    assert rule.disaggregate(make_request("x" * prompt_bytes), cycle_state, make_endpoint("d")) is expected


def test_threshold_rule_without_the_prefix_match_counts_nothing_cached() -> None:
    rule = ThresholdRule(100, 64, "prefix-cache-scorer")
    assert rule.disaggregate(make_request("x" * 100), CycleState(), make_endpoint("d")) is True
    assert rule.disaggregate(make_request("x" * 99), CycleState(), make_endpoint("d")) is False


def _pd_config(handler_params: str, extra_plugins: str = "") -> str:
    return f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
{extra_plugins}
- type: pd-profile-handler
  parameters:
{handler_params}
schedulingProfiles:
- name: pre
  plugins:
  - pluginRef: prefill-filter
- name: dec
  plugins:
  - pluginRef: decode-filter
"""


def test_pd_profile_handler_with_a_named_decider_and_custom_profiles() -> None:
    text = _pd_config(
        "    deciderPluginName: always\n    decodeProfile: dec\n    prefillProfile: pre",
        "- name: always\n  type: always-disagg-pd-decider\n- type: disagg-headers-handler\n"
        "  parameters:\n    prefillProfile: pre",
    )
    config = load_config_text(text, seed=1)
    handler = config.scheduler.handler
    assert isinstance(handler, PdProfileHandler)
    assert isinstance(handler.decider, AlwaysDisaggDecider)
    result = config.scheduler.schedule(make_request("x"), pool())
    assert (result.primary_profile, result.prefill_profile) == ("dec", "pre")
    assert result.prefill is not None and result.prefill.name == "p1"


def test_a_header_handler_naming_another_prefill_profile_than_the_pd_handler_is_refused() -> None:
    text = _pd_config(
        "    deciderPluginName: always\n    decodeProfile: dec\n    prefillProfile: pre",
        "- name: always\n  type: always-disagg-pd-decider\n- type: prefill-header-handler\n"
        "  parameters:\n    prefillProfile: dec",
    )
    with pytest.raises(ConfigError, match=r"prefillProfile: names profile 'dec', but the profile handler"):
        load_config_text(text)


@pytest.mark.parametrize(
    ("params", "extra", "message"),
    [
        ("    primaryPort: 8000", "", "primaryPort"),
        ("    deciderPluginName: nobody", "", "no plugin named 'nobody'"),
        ("    deciderPluginName: decode-filter", "", "is not a P/D decider"),
        (
            "    deciderPluginName: always\n    threshold: 10",
            "- name: always\n  type: always-disagg-pd-decider",
            "not both",
        ),
        ("    threshold: -1", "", "threshold"),
        ("    hashBlockSize: 0", "", "hashBlockSize"),
        ("    prefixPluginType: precise-prefix-cache-scorer", "", "epick's prefix scorer is"),
        ("    prefixPluginName: ''", "", "prefixPluginName"),
        (
            "    threshold: 0",
            "- type: prefill-header-handler\n  parameters:\n    prefillProfile: typo",
            "plugins[2].parameters.prefillProfile: profile 'typo' does not exist",
        ),
    ],
)
def test_pd_profile_handler_bad_parameters_are_named(params: str, extra: str, message: str) -> None:
    text = _pd_config(params + "\n    decodeProfile: dec\n    prefillProfile: pre", extra)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config_text(text, seed=1)


def test_threshold_zero_may_stand_beside_a_decider() -> None:
    text = _pd_config(
        "    deciderPluginName: always\n    threshold: 0\n    decodeProfile: dec\n    prefillProfile: pre",
        "- name: always\n  type: always-disagg-pd-decider",
    )
    handler = load_config_text(text, seed=1).scheduler.handler
    assert isinstance(handler, PdProfileHandler) and isinstance(handler.decider, AlwaysDisaggDecider)


def test_a_pd_config_without_a_prefill_profile_serves_decode_only() -> None:
    """As in llm-d: the prefill profile may be left out."""
    text = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: decode-filter
- type: prefix-based-pd-decider
- type: pd-profile-handler
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
"""
    config = load_config_text(text, seed=1)
    result = config.scheduler.schedule(make_request("x" * 400), pool())
    assert list(result.profile_results) == ["decode"]
    with pytest.raises(ConfigError, match=r"parameters.decodeProfile: profile 'dec' does not exist"):
        load_config_text(
            text.replace(
                "- type: pd-profile-handler",
                "- type: pd-profile-handler\n  parameters:\n    decodeProfile: dec",
            ),
            seed=1,
        )


def test_a_pd_handler_without_a_decider_or_threshold_needs_the_default_decider() -> None:
    """Upstream today: with neither deciderPluginName nor the old threshold form, the decider is the
    plugin named prefix-based-pd-decider, and a config without one does not load."""
    text = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: pd-profile-handler\n"
        "- type: decode-filter\nschedulingProfiles:\n- name: decode\n"
        "  plugins:\n  - pluginRef: decode-filter\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    (issue,) = info.value.issues
    assert issue.path == "plugins[0].parameters.deciderPluginName"
    assert (
        "there is no plugin named 'prefix-based-pd-decider' (the default deciderPluginName)" in issue.message
    )
