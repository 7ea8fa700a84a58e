"""Bad `EndpointPickerConfig` files: every error names the file, the path inside it and a fix.

Each case is written to a real file under tmp_path and loaded with `load_config_file`, so the
source in the message is the file's path. Loading raises `ConfigError`; nothing half-built comes back.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from epick.config import ConfigError, ConfigIssue, load_config_file, load_config_text

HEADER = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


@dataclass(frozen=True)
class Bad:
    id: str
    text: str  # the whole file; HEADER is prepended unless raw
    path: str  # exact path inside the document ("" for the whole file)
    message: str  # substring of the issue's message
    fix: str  # substring of the issue's fix
    raw: bool = False

    def document(self) -> str:
        body = textwrap.dedent(self.text)
        return body if self.raw else HEADER + body


CASES = [
    # --- the document itself
    Bad(
        "not-yaml",
        "apiVersion: [unclosed\n",
        "",
        "not valid YAML: line 2, column 1",
        "correct the YAML",
        raw=True,
    ),
    Bad(
        "tab-indent-not-yaml",
        "plugins:\n\t- type: x\n",
        "",
        "not valid YAML: line 4, column 1: found character '\\t'",
        "correct the YAML syntax there",
    ),
    Bad("empty-file", "", "", "the file is empty", "write an EndpointPickerConfig", raw=True),
    Bad("comments-only", "# nothing here\n", "", "the file is empty", "give no config file at all", raw=True),
    Bad(
        "top-level-list",
        "- type: queue-scorer\n",
        "",
        "expected a mapping at the top, found list",
        "start with 'apiVersion:'",
        raw=True,
    ),
    Bad("top-level-scalar", "EndpointPickerConfig\n", "", "found str", "start with 'apiVersion:'", raw=True),
    Bad(
        "missing-apiVersion",
        "kind: EndpointPickerConfig\n",
        "apiVersion",
        "required field 'apiVersion' is missing",
        "add 'apiVersion'",
        raw=True,
    ),
    Bad(
        "wrong-apiVersion",
        "apiVersion: v1\nkind: EndpointPickerConfig\n",
        "apiVersion",
        "'v1' is not allowed here",
        "use 'inference.networking.x-k8s.io/v1alpha1', "
        "'config.apix.gateway-api-inference-extension.sigs.k8s.io/v1alpha1', 'llm-d.ai/v1alpha1' "
        "or 'llm-d.ai/v1'",
        raw=True,
    ),
    Bad(
        "wrong-kind",
        "apiVersion: llm-d.ai/v1alpha1\nkind: PickerConfig\n",
        "kind",
        "'PickerConfig' is not allowed here",
        "use 'EndpointPickerConfig'",
        raw=True,
    ),
    Bad(
        "missing-kind",
        "apiVersion: llm-d.ai/v1alpha1\n",
        "kind",
        "required field 'kind' is missing",
        "add 'kind'",
        raw=True,
    ),
    Bad(
        "unknown-top-level-field",
        "schedulingProfile: []\n",
        "schedulingProfile",
        "unknown field 'schedulingProfile'",
        "did you mean 'schedulingProfiles'?",
    ),
    Bad(
        "plugins-not-a-list",
        "plugins: {type: queue-scorer}\n",
        "plugins",
        "Input should be a valid list",
        "correct the value",
    ),
    # --- plugin entries
    Bad(
        "plugin-without-type",
        "plugins:\n- type: queue-scorer\n- name: lonely\n",
        "plugins[1].type",
        "required field 'type' is missing",
        "add 'type'",
    ),
    Bad(
        "plugin-empty-type",
        "plugins:\n- type: ''\n",
        "plugins[0].type",
        "plugin has an empty type",
        "set 'type' to a registered plugin type",
    ),
    Bad(
        "unknown-plugin-type",
        "plugins:\n- type: queue-scorrer\n",
        "plugins[0].type",
        "unknown plugin type 'queue-scorrer'",
        "did you mean 'queue-scorer'?",
    ),
    Bad(
        "duplicate-plugin-name",
        """\
        plugins:
        - type: queue-scorer
        - name: queue-scorer
          type: kv-cache-utilization-scorer
        """,
        "plugins[1].name",
        "duplicate plugin name 'queue-scorer' (plugins[0] has it too)",
        "give each instance a distinct 'name'",
    ),
    Bad(
        "unknown-field-in-plugin",
        "plugins:\n- type: queue-scorer\n  paramters: {}\n",
        "plugins[0].paramters",
        "unknown field 'paramters'",
        "did you mean 'parameters'?",
    ),
    Bad(
        "parameters-not-a-mapping",
        "plugins:\n- type: queue-scorer\n  parameters: [1]\n",
        "plugins[0].parameters",
        "Input should be a valid dictionary",
        "correct the value",
    ),
    # --- parameter values
    Bad(
        "maxNumOfEndpoints-0",
        "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 0}\n",
        "plugins[0].parameters.maxNumOfEndpoints",
        "max-score-picker: Input should be greater than or equal to 1",
        "parameters of this type: maxNumOfEndpoints",
    ),
    Bad(
        "lruCapacityPerServer-negative",
        "plugins:\n- type: prefix-cache-scorer\n  parameters: {lruCapacityPerServer: -1}\n",
        "plugins[0].parameters.lruCapacityPerServer",
        "prefix-cache-scorer: Input should be greater than 0 (got -1)",
        "correct the value",
    ),
    Bad(
        "queueDepthThreshold-0",
        "plugins:\n- type: utilization-detector\n  parameters: {queueDepthThreshold: 0}\n",
        "plugins[0].parameters.queueDepthThreshold",
        "utilization-detector: Input should be greater than 0",
        "parameters of this type: queueDepthThreshold, kvCacheUtilThreshold",
    ),
    Bad(
        "kvCacheUtilThreshold-1.5",
        "plugins:\n- type: utilization-detector\n  parameters: {kvCacheUtilThreshold: 1.5}\n",
        "plugins[0].parameters.kvCacheUtilThreshold",
        "Input should be less than or equal to 1 (got 1.5)",
        "correct the value",
    ),
    Bad(
        "bad-duration-string",
        "plugins:\n- type: utilization-detector\n  parameters: {metricsStalenessThreshold: 5 minutes}\n",
        "plugins[0].parameters.metricsStalenessThreshold",
        "'5 minutes' is not a duration",
        "correct the value",
    ),
    Bad(
        "zero-duration",
        "plugins:\n- type: utilization-detector\n  parameters: {metricsStalenessThreshold: 0s}\n",
        "plugins[0].parameters.metricsStalenessThreshold",
        "Input should be greater than 0",
        "correct the value",
    ),
    Bad(
        "bad-request-timeout",
        "plugins:\n- type: active-request-scorer\n  parameters: {requestTimeout: soon}\n",
        "plugins[0].parameters.requestTimeout",
        "'soon' is not a duration",
        "parameters of this type: requestTimeout",
    ),
    Bad(
        "unknown-parameter",
        "plugins:\n- type: prefix-cache-scorer\n  parameters: {blockSize: 16}\n",
        "plugins[0].parameters.blockSize",
        "prefix-cache-scorer: unknown field 'blockSize'",
        "did you mean 'blockSizeTokens'?",
    ),
    Bad(
        "parameters-for-type-without-parameters",
        "plugins:\n- type: queue-scorer\n  parameters: {x: 1}\n",
        "plugins[0].parameters.x",
        "queue-scorer: unknown field 'x'",
        "this type takes no parameters",
    ),
    Bad(
        "label-selector-In-without-values",
        """\
        plugins:
        - type: label-selector-filter
          parameters:
            matchExpressions:
            - {key: gpu, operator: In}
        """,
        "plugins[0].parameters.matchExpressions[0]",
        "operator In needs a non-empty 'values' list",
        "correct the value",
    ),
    Bad(
        "label-selector-Exists-with-values",
        """\
        plugins:
        - type: label-selector-filter
          parameters:
            matchExpressions:
            - {key: gpu, operator: Exists, values: [a]}
        """,
        "plugins[0].parameters.matchExpressions[0]",
        "operator Exists takes no 'values'",
        "correct the value",
    ),
    Bad(
        "label-selector-bad-operator",
        """\
        plugins:
        - type: label-selector-filter
          parameters:
            matchExpressions:
            - {key: gpu, operator: Maybe}
        """,
        "plugins[0].parameters.matchExpressions[0].operator",
        "'Maybe' is not allowed here",
        "use 'In', 'NotIn', 'Exists' or 'DoesNotExist'",
    ),
    # --- profiles and references
    Bad(
        "undefined-pluginRef",
        """\
        plugins:
        - type: queue-scorer
        - type: shadow-profile-handler
          parameters: {primaryProfile: a}
        schedulingProfiles:
        - name: a
        - name: b
          plugins:
          - pluginRef: queue-scorr
        """,
        "schedulingProfiles[1].plugins[0].pluginRef",
        "refers to undefined plugin 'queue-scorr'",
        "did you mean 'queue-scorer'?",
    ),
    Bad(
        "undefined-pluginRef-nothing-close",
        """\
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: zzz
        """,
        "schedulingProfiles[0].plugins[0].pluginRef",
        "refers to undefined plugin 'zzz'",
        "define it under 'plugins' first",
    ),
    Bad(
        "duplicate-profile-names",
        """\
        plugins:
        - type: disagg-profile-handler
        schedulingProfiles:
        - name: decode
        - name: decode
        """,
        "schedulingProfiles[1].name",
        "duplicate profile name 'decode' (schedulingProfiles[0] has it too)",
        "give each profile a distinct name",
    ),
    Bad(
        "profile-without-name",
        "schedulingProfiles:\n- plugins: []\n",
        "schedulingProfiles[0].name",
        "required field 'name' is missing",
        "add 'name'",
    ),
    Bad(
        "profile-empty-name",
        "schedulingProfiles:\n- name: ''\n",
        "schedulingProfiles[0].name",
        "profile has an empty name",
        "give the profile a name",
    ),
    Bad(
        "unknown-field-in-profile",
        "schedulingProfiles:\n- name: a\n  plugin: []\n",
        "schedulingProfiles[0].plugin",
        "unknown field 'plugin'",
        "did you mean 'plugins'?",
    ),
    Bad(
        "unknown-field-in-pluginRef",
        """\
        plugins:
        - type: queue-scorer
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: queue-scorer
            wieght: 2
        """,
        "schedulingProfiles[0].plugins[0].wieght",
        "unknown field 'wieght'",
        "did you mean 'weight'?",
    ),
    Bad(
        "same-plugin-twice-in-profile",
        """\
        plugins:
        - type: queue-scorer
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: queue-scorer
          - pluginRef: queue-scorer
        """,
        "schedulingProfiles[0].plugins[1].pluginRef",
        "plugin 'queue-scorer' is referenced twice in this profile",
        "reference each plugin once per profile",
    ),
    Bad(
        "negative-weight",
        """\
        plugins:
        - type: queue-scorer
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: queue-scorer
            weight: -1
        """,
        "schedulingProfiles[0].plugins[0].weight",
        "weight -1.0 is not a finite number >= 0",
        "use a weight >= 0",
    ),
    Bad(
        "infinite-weight",
        """\
        plugins:
        - type: queue-scorer
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: queue-scorer
            weight: .inf
        """,
        "schedulingProfiles[0].plugins[0].weight",
        "weight inf is not a finite number >= 0",
        "use a weight >= 0",
    ),
    Bad(
        "non-numeric-weight",
        """\
        plugins:
        - type: queue-scorer
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: queue-scorer
            weight: heavy
        """,
        "schedulingProfiles[0].plugins[0].weight",
        "Input should be a valid number",
        "correct the value",
    ),
    Bad(
        "weight-on-non-scorer",
        """\
        plugins:
        - type: max-score-picker
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: max-score-picker
            weight: 2
        """,
        "schedulingProfiles[0].plugins[0].weight",
        "plugin 'max-score-picker' (max-score-picker) is not a scorer; only scorers take a weight",
        "remove 'weight'",
    ),
    Bad(
        "two-pickers-in-profile",
        """\
        plugins:
        - type: max-score-picker
        - type: random-picker
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: max-score-picker
          - pluginRef: random-picker
        """,
        "schedulingProfiles[0].plugins[1].pluginRef",
        "is a second picker in this profile (already max-score-picker/max-score-picker)",
        "keep one picker per profile",
    ),
    Bad(
        "profile-handler-in-profile",
        """\
        plugins:
        - type: single-profile-handler
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: single-profile-handler
        """,
        "schedulingProfiles[0].plugins[0].pluginRef",
        "plugin 'single-profile-handler' (single-profile-handler) is a profile handler",
        "the handler is used from the plugins list",
    ),
    # --- profile handlers
    Bad(
        "two-profiles-without-handler",
        "schedulingProfiles:\n- name: a\n- name: b\n",
        "plugins",
        "no profile handler configured for 2 profiles",
        "add a plugin of type disagg-profile-handler",
    ),
    Bad(
        "single-handler-with-two-profiles",
        """\
        plugins:
        - type: queue-scorer
        - type: single-profile-handler
        schedulingProfiles:
        - name: a
        - name: b
        """,
        "plugins[1].type",
        "single-profile-handler cannot run 2 profiles",
        "use disagg-profile-handler or shadow-profile-handler",
    ),
    Bad(
        "two-profile-handlers",
        """\
        plugins:
        - type: single-profile-handler
        - type: shadow-profile-handler
        """,
        "plugins",
        "more than one profile handler: 'single-profile-handler', 'shadow-profile-handler'",
        "keep exactly one profile handler",
    ),
    Bad(
        "disagg-names-missing-decode-profile",
        """\
        plugins:
        - type: queue-scorer
        - type: disagg-profile-handler
          parameters: {profiles: {decode: dec}}
        schedulingProfiles:
        - name: decode
        - name: prefill
        """,
        "plugins[1].parameters.profiles.decode",
        "profile 'dec' does not exist",
        "name one of the profiles: decode, prefill",
    ),
    Bad(
        "disagg-decider-without-prefill-profile",
        """\
        plugins:
        - type: always-disagg-pd-decider
        - type: disagg-profile-handler
          parameters: {deciders: {prefill: always-disagg-pd-decider}}
        schedulingProfiles:
        - name: decode
        """,
        "plugins[1].parameters.profiles.prefill",
        "profile 'prefill' does not exist",
        "name one of the profiles: decode",
    ),
    Bad(
        "disagg-decider-missing-plugin",
        """\
        plugins:
        - type: disagg-profile-handler
          parameters: {deciders: {prefill: nope}}
        schedulingProfiles:
        - name: decode
        - name: prefill
        """,
        "plugins[0].parameters.deciders.prefill",
        "disagg-profile-handler: there is no plugin named 'nope'",
        "name one of: disagg-profile-handler",
    ),
    Bad(
        "disagg-flat-decider-missing-plugin",
        """\
        plugins:
        - type: disagg-profile-handler
          parameters: {deciderPluginName: nope}
        schedulingProfiles:
        - name: decode
        - name: prefill
        """,
        "plugins[0].parameters.deciderPluginName",
        "there is no plugin named 'nope'",
        "name one of: disagg-profile-handler",
    ),
    Bad(
        "disagg-decider-not-a-decider",
        """\
        plugins:
        - type: queue-scorer
        - type: disagg-profile-handler
          parameters: {deciders: {prefill: queue-scorer}}
        schedulingProfiles:
        - name: decode
        - name: prefill
        """,
        "plugins[1].parameters.deciders.prefill",
        "plugin 'queue-scorer' (queue-scorer) is not a P/D decider",
        "name a prefix-based-pd-decider or always-disagg-pd-decider plugin",
    ),
    Bad(
        "disagg-mixes-flat-and-nested",
        """\
        plugins:
        - type: disagg-profile-handler
          parameters: {decodeProfile: decode, profiles: {decode: decode}}
        schedulingProfiles:
        - name: decode
        """,
        "plugins[0].parameters",
        "cannot mix the flat parameters",
        "correct the value",
    ),
    Bad(
        "disagg-decider-is-itself",
        """\
        plugins:
        - name: h
          type: disagg-profile-handler
          parameters: {deciders: {prefill: h}}
        schedulingProfiles:
        - name: decode
        - name: prefill
        """,
        "plugins[0].parameters",
        "plugins refer to each other in a cycle: h -> h",
        "break the cycle",
    ),
    Bad(
        "shadow-names-missing-primary",
        """\
        plugins:
        - type: shadow-profile-handler
          parameters: {primaryProfile: main}
        schedulingProfiles:
        - name: default
        - name: candidate
        """,
        "plugins[0].parameters.primaryProfile",
        "profile 'main' does not exist",
        "name one of the profiles: candidate, default",
    ),
    # --- saturation detector
    Bad(
        "saturationDetector-pluginRef-to-non-detector",
        """\
        plugins:
        - type: queue-scorer
        saturationDetector:
          pluginRef: queue-scorer
        """,
        "saturationDetector.pluginRef",
        "'queue-scorer' is not a saturation detector plugin of this config",
        "define a utilization-detector or concurrency-detector plugin",
    ),
    Bad(
        "saturationDetector-pluginRef-undefined",
        "saturationDetector:\n  pluginRef: sat\n",
        "saturationDetector.pluginRef",
        "'sat' is not a saturation detector plugin",
        "refer to its name",
    ),
    Bad(
        "saturationDetector-both-forms",
        """\
        plugins:
        - type: utilization-detector
        saturationDetector:
          pluginRef: utilization-detector
          queueDepthThreshold: 3
        """,
        "saturationDetector",
        "give either 'pluginRef' or thresholds, not both",
        "move the thresholds into the referenced plugin's parameters",
    ),
    Bad(
        "saturationDetector-bad-duration",
        "saturationDetector:\n  metricsStalenessThreshold: fast\n",
        "saturationDetector.metricsStalenessThreshold",
        "'fast' is not a duration",
        "correct the value",
    ),
    Bad(
        "saturationDetector-unknown-field",
        "saturationDetector:\n  queueDepth: 3\n",
        "saturationDetector.queueDepth",
        "unknown field 'queueDepth'",
        "did you mean 'queueDepthThreshold'?",
    ),
]


def test_the_table_is_big_and_distinct() -> None:
    assert len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({c.document() for c in CASES}) == len(CASES)


def _load_bad(tmp_path: Path, text: str) -> tuple[Path, ConfigError]:
    path = tmp_path / "bad-config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    return path, info.value


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_config(tmp_path: Path, case: Bad) -> None:
    path, err = _load_bad(tmp_path, case.document())
    source = str(path)
    assert err.source == source
    assert err.issues, "a ConfigError always carries at least one issue"
    matching = [i for i in err.issues if i.path == case.path and case.message in i.message]
    assert matching, f"no issue at {case.path!r} with {case.message!r}; got:\n{err}"
    issue = matching[0]
    assert case.fix in issue.fix
    # The rendered message names the file, the path in it, and the fix.
    where = f"{source}: {case.path}: " if case.path else f"{source}: "
    line = issue.render(source)
    assert line.startswith(where)
    assert f"(fix: {issue.fix})" in line
    assert line in str(err).splitlines()


def test_several_errors_are_all_reported_in_one_config_error(tmp_path: Path) -> None:
    text = HEADER + textwrap.dedent(
        """\
        plugins:
        - type: queue-scorrer
        - type: max-score-picker
          parameters: {maxNumOfEndpoints: 0}
        - type: prefix-cache-scorer
          parameters: {lruCapacityPerServer: -1, blockSize: 3}
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: nope
          - pluginRef: max-score-picker
            weight: -2
        - name: default
        """
    )
    path, err = _load_bad(tmp_path, text)
    paths = {i.path for i in err.issues}
    assert paths == {
        "plugins[0].type",
        "schedulingProfiles[0].plugins[0].pluginRef",
        "schedulingProfiles[0].plugins[1].weight",
        "schedulingProfiles[1].name",
        "plugins[1].parameters.maxNumOfEndpoints",
        "plugins[2].parameters.lruCapacityPerServer",
        "plugins[2].parameters.blockSize",
    }
    lines = str(err).splitlines()
    assert len(lines) == len(err.issues) == 7
    assert all(line.startswith(f"{path}: ") and "(fix: " in line for line in lines)


def test_errors_of_both_kinds_in_one_document_are_reported_together(tmp_path: Path) -> None:
    # A schema error in one plugin entry and another in a profile: both come from the one parse.
    text = HEADER + "plugins:\n- name: x\nschedulingProfiles:\n- name: a\n  plugin: []\nextra: 1\n"
    _, err = _load_bad(tmp_path, text)
    assert {i.path for i in err.issues} == {"plugins[0].type", "schedulingProfiles[0].plugin", "extra"}


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert info.value.source == str(path)
    assert str(info.value).startswith(f"{path}: cannot read the file: ")


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config_file(tmp_path)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(HEADER.encode() + b"# caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert str(info.value) == f"{path}: the file is not UTF-8 text"


def test_load_config_text_names_its_source() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(HEADER + "plugins:\n- type: nope-scorer\n", source="inline.yaml")
    assert str(info.value).startswith("inline.yaml: plugins[0].type: unknown plugin type 'nope-scorer'")


def test_issue_render_without_path_or_fix() -> None:
    assert ConfigIssue("", "broken").render("f.yaml") == "f.yaml: broken"
    assert ConfigIssue("a.b", "broken", "mend it").render("f.yaml") == "f.yaml: a.b: broken (fix: mend it)"


def test_a_good_load_after_a_bad_one_is_unaffected(tmp_path: Path) -> None:
    # Nothing of a failed load leaks into the next (no shared half-built state).
    _load_bad(tmp_path, HEADER + "plugins:\n- type: queue-scorer\n- type: queue-scorer\n")
    good = tmp_path / "good.yaml"
    good.write_text(HEADER + "plugins:\n- type: queue-scorer\n")
    config = load_config_file(good)
    assert list(config.plugins) == [
        "queue-scorer",
        "max-score-picker",
        "single-profile-handler",
        "metrics-data-source",
        "core-metrics-extractor",
    ]


# --- once bugs, now fixed ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "0s"])
def test_saturation_detector_zero_staleness_is_a_config_error(tmp_path: Path, value: str) -> None:
    _, err = _load_bad(tmp_path, HEADER + f"saturationDetector:\n  metricsStalenessThreshold: {value}\n")
    assert err.issues[0].path == "saturationDetector.metricsStalenessThreshold"


@pytest.mark.parametrize(
    ("field", "value"),
    [("kvCacheUtilThreshold", "1.5"), ("kvCacheUtilThreshold", "-0.2"), ("queueDepthThreshold", "-3")],
)
def test_saturation_detector_out_of_range_threshold_is_a_config_error(
    tmp_path: Path, field: str, value: str
) -> None:
    _, err = _load_bad(tmp_path, HEADER + f"saturationDetector:\n  {field}: {value}\n")
    assert err.issues[0].path == f"saturationDetector.{field}"


def test_disagg_decider_missing_plugin_names_the_exact_parameter(tmp_path: Path) -> None:
    text = HEADER + textwrap.dedent(
        """\
        plugins:
        - name: pd-decider
          type: prefix-based-pd-decider
        - type: disagg-profile-handler
          parameters: {deciders: {prefill: pd-decidr}}
        schedulingProfiles:
        - name: decode
        - name: prefill
        """
    )
    _, err = _load_bad(tmp_path, text)
    issue = err.issues[0]
    assert issue.path == "plugins[1].parameters.deciders.prefill"
    assert "did you mean 'pd-decider'?" in issue.fix


def test_unknown_nested_parameter_gets_did_you_mean(tmp_path: Path) -> None:
    text = HEADER + textwrap.dedent(
        """\
        plugins:
        - type: disagg-profile-handler
          parameters: {profiles: {decod: decode}}
        schedulingProfiles:
        - name: decode
        """
    )
    _, err = _load_bad(tmp_path, text)
    issue = err.issues[0]
    assert issue.path == "plugins[0].parameters.profiles.decod"
    assert "did you mean 'decode'?" in issue.fix


def test_a_plugin_that_schedules_nothing_in_a_profile_is_ignored_with_a_warning() -> None:
    # As upstream's profile does: GIE v1.5's integration configs list their parser in the profile.
    config = load_config_text(
        HEADER + "plugins:\n- name: decider\n  type: prefix-based-pd-decider\n- type: queue-scorer\n"
        "schedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: decider\n  - pluginRef: queue-scorer\n"
    )
    (warning,) = [w for w in config.warnings if "decider" in w]
    assert warning.startswith("schedulingProfiles[0].plugins[0]: plugin 'decider' (prefix-based-pd-decider)")
    assert "the profile ignores it" in warning
    assert [s.scorer.typed_name.name for s in config.scheduler.profiles["a"].scorers] == ["queue-scorer"]
