"""`epick check-config` and `epick plugins`, run in-process; one run through the console script."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from epick.cli.main import main
from epick.config.entrypoints import default_registry
from epick.plugins import in_tree_plugins
from epick.plugins.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "config"
HEADER = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_good_file_prints_ok_and_one_line_per_profile(capsys: pytest.CaptureFixture[str]) -> None:
    path = CONFIGS / "default.yaml"
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        f"{path}: ok",
        "  profile default: filters [none]; scorers [queue-scorer/queue-scorer×2, "
        "kv-cache-utilization-scorer/kv-cache-utilization-scorer×2, "
        "prefix-cache-scorer/prefix-cache-scorer×3]; "
        "picker max-score-picker/max-score-picker",
        "  profile handler: single-profile-handler/single-profile-handler",
        "  parsers: openai-parser/openai-parser, anthropic-parser/anthropic-parser, "
        "vllmhttp-parser/vllmhttp-parser, passthrough-parser/passthrough-parser",
        "  data sources: metrics-data-source/metrics-data-source -> "
        "core-metrics-extractor/core-metrics-extractor",
    ]


def test_all_shipped_configs_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    files = {"default": 1, "pd": 2, "lora": 1, "shadow": 2}  # name -> number of profiles
    assert main(["check-config", *(str(CONFIGS / f"{n}.yaml") for n in files)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    # Split the output into one block per file.
    blocks: dict[str, list[str]] = {}
    current = ""
    for line in out.splitlines():
        if not line.startswith("  "):
            assert line.endswith(": ok")
            current = Path(line.removesuffix(": ok")).stem
            blocks[current] = []
        else:
            blocks[current].append(line.strip())
    assert list(blocks) == list(files)
    for name, n_profiles in files.items():
        lines = blocks[name]
        assert sum(line.startswith("profile ") and "handler" not in line for line in lines) == n_profiles
        assert lines[-3].startswith("profile handler: ")
        assert lines[-2].startswith("parsers: ")
        assert lines[-1].startswith("data sources: metrics-data-source/metrics-data-source")
    assert "profile decode: filters [decode-filter/decode-filter]" in blocks["pd"][0]
    assert blocks["pd"][-3] == "profile handler: disagg-profile-handler/disagg-profile-handler"
    assert "picker candidate-picker/weighted-random-picker" in blocks["shadow"][1]


def test_warnings_are_printed_for_good_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path, "c.yaml", HEADER + "requestControl: {}\nfeatureGates: [haPopulateNonLeaderDatastore]\n"
    )
    assert main(["check-config", str(path)]) == 0
    out, _ = capsys.readouterr()
    warnings = [line for line in out.splitlines() if line.startswith("  warning: ")]
    assert len(warnings) == 2
    assert any(
        w.startswith("  warning: feature gate 'haPopulateNonLeaderDatastore' is accepted but not used")
        for w in warnings
    )


def test_bad_files_exit_2_and_list_every_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad1 = write(
        tmp_path,
        "bad1.yaml",
        HEADER
        + "plugins:\n- type: queue-scorrer\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 0}\n",
    )
    bad2 = write(tmp_path, "bad2.yaml", "apiVersion: v2\nkind: EndpointPickerConfig\nschedulingProfile: []\n")
    good = CONFIGS / "lora.yaml"
    missing = tmp_path / "missing.yaml"
    assert main(["check-config", str(bad1), str(good), str(bad2), str(missing)]) == 2
    out, err = capsys.readouterr()
    # The good file is still checked and reported.
    assert f"{good}: ok" in out.splitlines()
    assert "bad1" not in out
    assert "bad2" not in out
    assert err.splitlines() == [
        f"{bad1}: plugins[0].type: unknown plugin type 'queue-scorrer' (fix: did you mean 'queue-scorer'? "
        f"(run 'epick plugins' to list them; {len(default_registry()[0].types())} are registered))",
        f"{bad1}: plugins[1].parameters.maxNumOfEndpoints: max-score-picker: Input should be greater than or "
        "equal to 1 (got 0) (fix: correct the value; parameters of this type: maxNumOfEndpoints)",
        f"{bad2}: apiVersion: 'v2' is not allowed here (fix: use 'inference.networking.x-k8s.io/v1alpha1', "
        "'config.apix.gateway-api-inference-extension.sigs.k8s.io/v1alpha1', 'llm-d.ai/v1alpha1' "
        "or 'llm-d.ai/v1')",
        f"{bad2}: schedulingProfile: unknown field 'schedulingProfile' (fix: did you mean "
        "'schedulingProfiles'? (allowed here: apiVersion, kind, plugins, schedulingProfiles, featureGates, "
        "saturationDetector, dataLayer, data, flowControl, requestControl, parser, requestHandler))",
        f"{missing}: cannot read the file: No such file or directory",
    ]


def test_check_config_needs_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["check-config"])
    assert info.value.code == 2
    assert "FILE" in capsys.readouterr().err


def test_check_config_zero_staleness_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "c.yaml", HEADER + "saturationDetector:\n  metricsStalenessThreshold: 0\n")
    assert main(["check-config", str(path)]) == 2
    assert f"{path}: saturationDetector.metricsStalenessThreshold" in capsys.readouterr().err


def _out_of_tree_aliases(registry: Registry) -> set[str]:
    in_tree = {spec.type for spec in in_tree_plugins()}
    return {alias for spec in registry if spec.type not in in_tree for alias in spec.aliases}


def test_plugins_lists_all_in_tree_types(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out, _ = capsys.readouterr()
    listed = [line.split()[0] for line in out.splitlines()]
    in_tree = [spec.type for spec in in_tree_plugins()]
    aliases = [alias for spec in in_tree_plugins() for alias in spec.aliases]
    assert (len(in_tree), len(aliases)) == (118, 8)
    assert set(in_tree) <= set(listed)
    # Exactly the registered types (in-tree plus any installed out-of-tree ones), each once, with
    # their aliases on their line.
    registry = default_registry()[0]
    assert sorted(listed) == sorted(spec.type for spec in registry)
    assert sorted(listed + aliases) == sorted(set(registry.types()) - _out_of_tree_aliases(registry))
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["least-queue-filter"].endswith("(also: least-queue)")
    assert lines["label-selector-filter"].endswith("(also: by-label-selector)")
    assert (
        "[parameters: blockSizeTokens, maxPrefixBlocksToMatch, lruCapacityPerServer, hashBlockSize, "
        "autoTune, prefixMatchInfoProducerName, matchLengthWeight, matchLengthScaleTokens]" in out
    )
    queue_line = next(line for line in out.splitlines() if line.startswith("queue-scorer "))
    assert queue_line.endswith("[parameters: -]")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("epick ")


def test_console_script(tmp_path: Path) -> None:
    """The installed `epick` script runs the same CLI (the one subprocess test here)."""
    script = Path(sys.executable).with_name("epick")
    assert script.exists(), f"console script not installed next to {sys.executable}"
    bad = write(tmp_path, "bad.yaml", HEADER + "plugins:\n- type: nope\n")
    done = subprocess.run(
        [str(script), "check-config", str(CONFIGS / "pd.yaml"), str(bad)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"{CONFIGS / 'pd.yaml'}: ok" in done.stdout
    assert "  profile prefill: filters [prefill-filter/prefill-filter]" in done.stdout
    assert f"{bad}: plugins[0].type: unknown plugin type 'nope'" in done.stderr


def test_a_reader_that_leaves_early_gets_no_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """`epick check-config FILE | head -1`: the pipe closes while epick still prints."""

    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["check-config", str(CONFIGS / "default.yaml")]) == 0


def test_every_config_in_the_repository_checks(capsys: pytest.CaptureFixture[str]) -> None:
    shipped = sorted(CONFIGS.glob("*.yaml"))
    assert {p.name for p in shipped} >= {"predicted-latency.yaml", "predicted-latency-pd.yaml"}
    assert main(["check-config", *map(str, shipped)]) == 0
    out, _ = capsys.readouterr()
    assert out.count(": ok") == len(shipped)
