"""`epick simulate` from the command line: the table, the JSON schema, the plot, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from epick.cli.main import main
from epick.cli.simulate_policies import CONFIG_POLICIES

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
        results.append(out.read_text())
    assert results[0] == results[1]  # the JSON holds no wall-clock figure: byte for byte the same


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "nope"], "unknown --policy 'nope'"),
        ([], "give at least one --policy or --config"),
        (["--policy", "default", "--workload", "nope"], "nope"),
        (["--policy", "default", "--param", "groups"], "expected NAME=VALUE"),
        (
            ["--policy", "default", "--param", "groups=3", "--param", "groups=4"],
            "--param groups is given twice",
        ),
        (["--policy", "default", "--servers", "2", "--prefill-servers", "2"], "--prefill-servers must be"),
        (["--policy", "default", "--servers", "0"], "--servers: '0' is not a positive integer"),
        (["--policy", "default", "--qps", "0"], "--qps: '0' is not a positive number"),
        (["--policy", "default", "--qps", "-3"], "--qps: '-3' is not a positive number"),
        (["--policy", "default", "--qps", "nan"], "--qps: 'nan' is not a positive number"),
        (["--policy", "default", "--qps", "inf"], "--qps: 'inf' is not a positive number"),
        (["--policy", "default", "--qps-sweep", "5,-1"], "'-1' is not a positive number"),
        (["--policy", "default", "--qps-sweep", "a,b"], "'a' is not a positive number"),
        (["--policy", "default", "--concurrency", "0"], "--concurrency: '0' is not a positive integer"),
        (["--policy", "default", "--requests", "0"], "--requests: '0' is not a positive integer"),
        (["--policy", "default", "--requests", "-1"], "--requests: '-1' is not a positive integer"),
        (["--policy", "default", "--num-gpu-blocks", "0"], "--num-gpu-blocks: '0' is not a positive integer"),
        (["--policy", "default", "--max-num-seqs", "-1"], "--max-num-seqs: '-1' is not a positive integer"),
        (["--policy", "default", "--max-loras", "0"], "--max-loras: '0' is not a positive integer"),
        (["--policy", "default", "--slo-ttft", "0"], "--slo-ttft: '0' is not a positive number"),
        (["--policy", "default", "--scrape-interval", "-1"], "cannot be negative"),
        (["--policy", "default", "--scrape-interval", "soon"], "is not a duration"),
        (["--policy", "default", "--json", "/nonexistent-dir/x.json"], "cannot write it"),
        (["--policy", "default", "--json", "/proc/x.json"], "cannot write it"),
        (["--policy", "default", "--scrape-interval", "nan"], "not a finite duration"),
        (["--policy", "default", "--scrape-interval", "inf"], "not a finite duration"),
        (["--policy", "default", "--json", "/tmp"], "is a directory"),
        (["--policy", "default", "--plot", "x.txt"], "ending in .png"),
        (["--policy", "default", "--workload", "trace", "--param", "path=/tmp"], "is a directory"),
    ],
)
def test_bad_input_is_named(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every bad argument is a usage error (exit 2) naming it, before anything runs."""
    try:
        code = main(["simulate", *argv])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_rows_keep_the_command_line_order_and_names_stay_unique(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "default.yaml").write_text((CONFIGS / "default.yaml").read_text())
    out = tmp_path / "runs.json"
    argv = [
        *("simulate", *SMALL, "--config", str(CONFIGS / "default.yaml"), "--policy", "round-robin"),
        *("--policy", "default", "--config", str(other / "default.yaml")),
        *("--config", str(other / "default.yaml"), "--qps", "20", "--json", str(out)),
    ]
    assert main(argv) == 0
    names = [r["policy"] for r in json.loads(out.read_text())["runs"]]
    assert names == [
        "default",
        "round-robin",
        "default#2",  # the named policy after the file of the same name
        str(other / "default"),
        f"{other / 'default'}#2",
    ]


def trace_file(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_bad_trace_line_found_during_the_run_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [json.dumps({"arrival": i * 0.1, "prompt": "a b c", "output_tokens": 4}) for i in range(5)]
    path = trace_file(tmp_path, [*good, '{"arrival": 1.0, "prompt": "a", "output_tokens": 0}'])
    out = tmp_path / "runs.json"
    argv = ["simulate", "--policy", "default", "--workload", "trace", "--param", f"path={path}"]
    assert main([*argv, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "trace.jsonl:6: field 'output_tokens': must be a positive integer, got 0" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_a_trace_takes_no_rate_and_reports_no_load_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = trace_file(tmp_path, [json.dumps({"arrival": 0.5, "prompt": "a b c", "output_tokens": 4})])
    argv = ["simulate", "--policy", "default", "--workload", "trace", "--param", f"path={path}"]
    assert main([*argv, "--qps", "5"]) == 2
    assert "do not apply to a trace" in capsys.readouterr().err
    out = tmp_path / "runs.json"
    assert main([*argv, "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert (run["qps"], run["load_kind"], run["completed"]) == (None, "trace", 1)


def test_an_empty_trace_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = trace_file(tmp_path, ["", "   "])
    assert main(["simulate", "--policy", "default", "--workload", "trace", "--param", f"path={path}"]) == 2
    assert "has no requests" in capsys.readouterr().err


def test_failure_reasons_are_printed_and_in_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs.json"
    argv = [
        *("simulate", "--policy", "round-robin", "--servers", "2", "--workload", "long-doc-qa"),
        *("--param", "document-tokens=200000", "--requests", "6", "--json", str(out)),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "round-robin @ 10: 6 failed" in printed
    assert "6 × prompt (" in printed and "exceeds max_model_len (131072)" in printed
    (run,) = json.loads(out.read_text())["runs"]
    assert run["failed"] == 6
    assert [r["count"] for r in run["failure_reasons"]] == [6]


def test_scrape_interval_takes_a_duration_or_seconds(tmp_path: Path) -> None:
    outs = []
    for value in ("0.2", "200ms"):
        out = tmp_path / f"{value}.json"
        assert (
            main(["simulate", *SMALL, "--policy", "default", "--scrape-interval", value, "--json", str(out)])
            == 0
        )
        outs.append(out.read_text())
    assert outs[0] == outs[1]
