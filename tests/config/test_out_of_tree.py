"""An out-of-tree plugin package, installed with pip, registers its type through entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "epick-plugin-example"

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: prefer-h100
  type: label-preference-scorer
  parameters: {key: gpu, value: h100}
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefer-h100
    weight: 5
  - pluginRef: queue-scorer
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip-installs the example into a private directory (no network, no change to the venv)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
            "--no-index", "--target", str(target), str(EXAMPLE),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return target


def run_epick(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run(
        [sys.executable, "-m", "epick.cli.main", *args], env=env, capture_output=True, text=True, check=False
    )


def test_installed_plugin_is_listed(installed: Path) -> None:
    out = run_epick(installed, "plugins")
    assert out.returncode == 0, out.stderr
    assert "label-preference-scorer" in out.stdout


def test_installed_plugin_is_used_in_a_config(installed: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    endpoints = tmp_path / "eps.json"
    endpoints.write_text(
        json.dumps(
            [
                {"name": "a", "labels": {"gpu": "a100"}, "metrics": {"waiting_queue_size": 0}},
                {"name": "b", "labels": {"gpu": "h100"}, "metrics": {"waiting_queue_size": 3}},
            ]
        )
    )
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"model": "m", "prompt": "hi"}))
    checked = run_epick(installed, "check-config", str(config))
    assert checked.returncode == 0, checked.stderr
    assert "prefer-h100/label-preference-scorer×5" in checked.stdout
    out = run_epick(
        installed,
        "explain",
        "--config",
        str(config),
        "--endpoints",
        str(endpoints),
        "--request",
        str(request),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    # a: 5*0 + 1*1 = 1; b: 5*1 + 1*0 = 5 (queue 0,3: a=(3-0)/3=1, b=0) -> b
    assert result["profiles"]["default"]["totals"] == {"a": 1.0, "b": 5.0}
    assert result["targets"] == ["b"]


def test_without_the_package_the_type_is_unknown(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    out = run_epick(tmp_path, "check-config", str(config))
    assert out.returncode == 2
    assert "plugins[0].type: unknown plugin type 'label-preference-scorer'" in out.stderr
