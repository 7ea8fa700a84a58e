"""`epick simulate --ray-address`: the cells on a Ray instance this test starts on this machine (2 CPUs),
the same figures as a serial run."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from epick.cli.main import main

SMALL = [
    *("--servers", "3", "--workload", "shared-prefix", "--param", "groups=4"),
    *("--param", "prompts-per-group=6", "--param", "system-tokens=300", "--param", "output-tokens=8"),
]


@pytest.mark.ray
def test_a_local_ray_instance_gives_the_figures_a_serial_run_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'epick[ray]'")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    config = Path(__file__).resolve().parents[2] / "config" / "load-only.yaml"
    argv = [
        *("simulate", *SMALL, "--policy", "default", "--policy", "sglang-cache-aware"),
        *("--config", str(config), "--qps-sweep", "5,40", "--seeds", "2"),
    ]
    context = ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    try:
        address = context.address_info["address"]
        assert main([*argv, "--ray-address", address, "--json", str(tmp_path / "ray.json")]) == 0
    finally:
        ray.shutdown()
    assert "12 cells in" in (err := capsys.readouterr().err) and f"on Ray ({address})" in err
    assert main([*argv, "--jobs", "1", "--json", str(tmp_path / "serial.json")]) == 0
    assert (tmp_path / "ray.json").read_text() == (tmp_path / "serial.json").read_text()


def test_without_ray_the_flag_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    assert main(["simulate", *SMALL, "--policy", "default", "--ray-address", "auto"]) == 2
    assert "needs Ray, which is not installed: pip install 'epick[ray]'" in capsys.readouterr().err
