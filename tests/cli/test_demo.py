"""`epick demo` end to end, on a small workload: four simulated servers, the proxy, two configs."""

from __future__ import annotations

import re

import pytest

from epick.cli.main import main


def test_demo_runs_both_configs_and_prefix_affinity_wins_on_hit_rate(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["demo", "--groups", "8", "--prompts-per-group", "4"]) == 0
    out = capsys.readouterr().out
    assert "default config" in out and "round-robin" in out
    # Round-robin spreads 32 requests evenly: 8 on each of the four servers.
    rows = {m.group(1): m.group(3) for m in re.finditer(r"requests on (sim-\d)\s+│\s+(\d+)\s+│\s+(\d+)", out)}
    assert rows == {f"sim-{i}": "8" for i in range(4)}
    hit = re.search(r"hit rate \(servers' metrics\)\s+│\s+([\d.]+)%\s+│\s+([\d.]+)%", out)
    assert hit is not None
    # Each group's prefix stays on one server with the default config; round-robin re-computes it on
    # every server the group touches.
    assert float(hit.group(1)) > float(hit.group(2))
    assert re.search(r"errors\s+│\s+0\s+│\s+0", out)
