"""`epick simulate` from the command line: the table, the JSON schema, the plot, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from epick.cli.main import main
from epick.cli.simulate import CONFIG_POLICIES

CONFIGS = Path(__file__).resolve().parents[2] / "config"
SMALL = [
    *("--servers", "3", "--workload", "shared-prefix", "--param", "groups=4"),
    *("--param", "prompts-per-group=5", "--param", "system-tokens=400", "--param", "output-tokens=8"),
]


def test_named_config_policies_are_the_shipped_files() -> None:
    for name, text in CONFIG_POLICIES.items():
        assert yaml.safe_load(text) == yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())


def test_json_has_one_run_per_policy_and_load(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    plot = tmp_path / "runs.png"
    argv = [
        *("simulate", *SMALL, "--policy", "default", "--policy", "round-robin"),
        *("--config", str(CONFIGS / "load-only.yaml"), "--qps-sweep", "5,40"),
        *("--json", str(out), "--plot", str(plot)),
    ]
    assert main(argv) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["policy"], r["qps"]) for r in runs] == [
        ("default", 5.0), ("round-robin", 5.0), ("load-only", 5.0),
        ("default", 40.0), ("round-robin", 40.0), ("load-only", 40.0),
    ]  # fmt: skip
    for r in runs:
        assert set(r["ttft_s"]) == {"p50", "p90", "p99"} and set(r["tpot_s"]) == {"p50", "p99"}
        assert set(r["e2e_s"]) == {"p50", "p99"}
        for key in ("output_tokens_per_s", "requests_per_s", "prefix_cache_hit_rate", "load_cov", "goodput"):
            assert isinstance(r[key], float)
        assert r["completed"] + r["failed"] == 20
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_seed_same_numbers(tmp_path: Path) -> None:
    results = []
    for i in range(2):
        out = tmp_path / f"{i}.json"
        assert (
            main(
                ["simulate", *SMALL, "--policy", "default", "--qps", "20", "--seed", "7", "--json", str(out)]
            )
            == 0
        )
        run = json.loads(out.read_text())["runs"][0]
        run.pop("wall_s")
        results.append(run)
    assert results[0] == results[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "nope"], "unknown --policy 'nope'"),
        (["--policy", "default", "--workload", "nope"], "nope"),
        (["--policy", "default", "--param", "groups"], "expected NAME=VALUE"),
        (["--policy", "default", "--servers", "2", "--prefill-servers", "2"], "--prefill-servers must be"),
        (["--policy", "default", "--servers", "0"], "--servers must be at least 1"),
    ],
)
def test_bad_input_is_named(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["simulate", *argv])
    except SystemExit as e:
        code = 2
        assert message in str(e)
    else:
        assert message in capsys.readouterr().err
    assert code == 2
