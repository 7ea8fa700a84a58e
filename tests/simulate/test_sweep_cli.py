"""`epick simulate` sweeps: worker processes give what a serial run gives, seeds give means and
intervals, grid files, and the warnings and timing a sweep prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from epick.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    *("--servers", "3", "--workload", "shared-prefix", "--param", "groups=4"),
    *("--param", "prompts-per-group=5", "--param", "system-tokens=400", "--param", "output-tokens=8"),
]


def simulate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["simulate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_two_workers_write_what_one_writes_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        *SMALL,
        *(
            "--policy",
            "default",
            "--policy",
            "round-robin",
            "--config",
            str(ROOT / "config" / "load-only.yaml"),
        ),
        *("--policy", "precise-prefix", "--qps-sweep", "5,40", "--seeds", "2"),
    ]
    results = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.json"
        code, printed, err = simulate([*argv, "--jobs", jobs, "--json", str(out)], capsys)
        assert code == 0
        results.append((out.read_text(), printed))
        # No progress bar off a terminal; the wall time and rate, and where the cells ran.
        (line,) = err.splitlines()
        where = "in this process" if jobs == "1" else "on 2 workers"
        assert line.startswith("16 cells in ") and f" {where}: " in line and " cells/min; " in line
    assert results[0] == results[1]
    runs = json.loads(results[0][0])["runs"]
    assert [(r["qps"], r["policy"], r["seed"]) for r in runs[:5]] == [
        (5.0, "default", 0), (5.0, "default", 1), (5.0, "round-robin", 0),
        (5.0, "round-robin", 1), (5.0, "load-only", 0),
    ]  # fmt: skip
    assert "wall_s" not in runs[0]


def test_seeds_give_means_intervals_and_mark_the_noise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "runs.json", tmp_path / "runs.png"
    argv = [*SMALL, "--policy", "default", "--policy", "round-robin", "--qps", "20", "--seeds", "3"]
    code, printed, _ = simulate([*argv, "--json", str(out), "--plot", str(png)], capsys)
    assert code == 0
    document = json.loads(out.read_text())
    assert [r["seed"] for r in document["runs"]] == [0, 1, 2, 0, 1, 2]
    default, round_robin = document["stats"]
    assert default["seeds"] == [0, 1, 2]
    hits = [r["prefix_cache_hit_rate"] for r in document["runs"][:3]]
    hit = default["figures"]["prefix_cache_hit_rate"]
    assert hit["mean"] == pytest.approx(sum(hits) / 3)
    assert hit["ci95"][0] <= hit["mean"] <= hit["ci95"][1]
    # The default config follows the shared prefixes; round-robin does not: beyond the noise.
    assert (hit["vs_best"], round_robin["figures"]["prefix_cache_hit_rate"]["vs_best"]) == ("best", "worse")
    # Nothing fails for either: equal on every seed, so within the noise.
    assert {default["figures"]["failed"]["vs_best"], round_robin["figures"]["failed"]["vs_best"]} == {
        "best",
        "within noise",
    }
    assert document["summary"]["metric"] == "ttft_p90"
    assert "±" in printed and " *" in printed and "3 seeds per cell: mean ± half-width" in printed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_seed_keeps_the_plain_table_and_has_no_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs.json"
    code, printed, _ = simulate([*SMALL, "--policy", "default", "--json", str(out)], capsys)
    assert code == 0 and "±" not in printed and "goodput/s" in printed
    (row,) = json.loads(out.read_text())["stats"]
    assert row["figures"]["ttft_p50"]["ci95"] is None


def test_more_requests_than_the_workload_makes_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate([*SMALL, "--policy", "round-robin", "--requests", "50"], capsys)
    assert code == 0
    assert (
        "epick simulate: warning: --requests 50 is more than the shared-prefix workload makes: 20 requests "
        "(groups 4 × prompts-per-group 5), so 20 run; raise groups or prompts-per-group for more"
    ) in err
    assert "warning" not in simulate([*SMALL, "--policy", "round-robin", "--requests", "20"], capsys)[2]


def test_a_trace_shorter_than_requests_is_a_warning_after_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "day.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"arrival": i * 0.1, "prompt": "a b c", "output_tokens": 4}) + "\n" for i in range(3)
        )
    )
    argv = ["--policy", "default", "--workload", "trace", "--param", f"path={trace}", "--requests", "5"]
    code, _, err = simulate(argv, capsys)
    assert code == 0
    assert "--requests 5 is more than the trace workload made: 3 requests, one per line of its trace" in err


def grid_file(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "policies": ["default", "round-robin"],
                "configs": [str(ROOT / "config" / "load-only.yaml")],
                "workloads": [
                    {
                        "kind": "shared-prefix",
                        "params": {
                            "groups": 4,
                            "prompts-per-group": 4,
                            "system-tokens": [100, 1500],
                            "output-tokens": 8,
                        },
                    }
                ],
                "loads": {"qps": [5, 60]},
                "servers": [2, 3],
                "seeds": 2,
                "requests": 12,
                "metric": "prefix_cache_hit_rate",
            }
        )
    )
    return path


def test_a_grid_runs_the_same_on_one_and_two_workers_and_names_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = grid_file(tmp_path)
    texts = []
    for jobs in ("1", "2"):
        out = tmp_path / f"{jobs}.json"
        code, printed, err = simulate(["--grid", str(grid), "--jobs", jobs, "--json", str(out)], capsys)
        assert code == 0, err
        texts.append(out.read_text())
    assert texts[0] == texts[1]
    document = json.loads(texts[0])
    written = yaml.safe_load(grid.read_text())
    for key in ("policies", "configs", "servers", "seeds", "requests", "metric"):
        assert document["grid"][key] == written[key]  # the grid as written, with the defaults
    assert document["grid"]["workloads"][0]["params"] == written["workloads"][0]["params"]
    assert document["grid"]["loads"] == {"qps": [5.0, 60.0], "concurrency": None}
    assert document["grid"]["engine_profiles"] == ["llama-3.1-8b-h100"]
    runs = document["runs"]
    assert len(runs) == 3 * 2 * 2 * 2 * 2 == 48
    assert {r["workload"] for r in runs} == {
        "shared-prefix system-tokens=100",
        "shared-prefix system-tokens=1500",
    }
    assert {r["servers"] for r in runs} == {2, 3} and all(r["completed"] + r["failed"] == 12 for r in runs)
    summary = document["summary"]
    assert summary["metric"] == "prefix_cache_hit_rate" and summary["higher_is_better"] is True
    assert len(summary["points"]) == 2 * 2 * 2
    for point in summary["points"]:
        assert sorted(point["ranking"]) == ["default", "load-only", "round-robin"]
        assert point["best"] == point["ranking"][0]
        mine = [r for r in runs if r["policy"] == point["best"] and r["qps"] == point["qps"]
                and r["servers"] == point["servers"] and r["workload"] == point["workload"]]  # fmt: skip
        assert point["prefix_cache_hit_rate"]["mean"] == pytest.approx(
            sum(r["prefix_cache_hit_rate"] for r in mine) / 2
        )
    for flip in summary["flips"]:
        assert flip["best_before"] != flip["best_after"] and flip["axis"] in {"workload", "servers", "load"}
    assert "best policy per point, by prefix_cache_hit_rate (higher is better)" in printed


def test_the_sample_grid_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = yaml.safe_load((ROOT / "examples" / "simulate" / "grid.yaml").read_text())
    sample |= {"requests": 10, "seeds": 1, "servers": [4], "loads": {"qps": [10, 60]}}
    sample["configs"] = [str(ROOT / "config" / "load-only.yaml")]
    small = tmp_path / "grid.yaml"
    small.write_text(yaml.safe_dump(sample))
    out = tmp_path / "grid.json"
    code, printed, err = simulate(["--grid", str(small), "--json", str(out)], capsys)
    assert code == 0, err
    points = json.loads(out.read_text())["summary"]["points"]
    assert len(points) == 3 * 2  # three workloads, two loads
    assert "24 cells in" in err
    assert "1 seed per cell: no intervals (n/a" in printed and "±" not in printed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--servers", "4"], "--grid sets the cells: --servers belongs in the grid file"),
        (["--policy", "default", "--qps", "3"], "--policy/--config, --qps belong in the grid file"),
        (["--seeds", "2"], "--seeds belongs in the grid file"),
    ],
)
def test_a_grid_refuses_the_flags_it_replaces(
    tmp_path: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = simulate(["--grid", str(grid_file(tmp_path)), *extra], capsys)
    assert code == 2 and message in err


def test_a_bad_grid_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "policies: [default]\nloads: {qps: [0]}\nworkloads: [{kind: shared-prefix, params: {grups: 3}}]\n"
    )
    code, _, err = simulate(["--grid", str(bad)], capsys)
    assert code == 2 and "loads.qps.0: Input should be greater than 0" in err and "Traceback" not in err
    bad.write_text("policies: [default]\nworkloads: [{kind: shared-prefix, params: {grups: 3}}]\n")
    code, _, err = simulate(["--grid", str(bad)], capsys)
    assert code == 2 and "unknown parameter 'grups' for workload shared-prefix" in err
    bad.write_text("policies: [nope]\n")
    code, _, err = simulate(["--grid", str(bad)], capsys)
    assert code == 2 and "unknown --policy 'nope'" in err
    code, _, err = simulate(["--grid", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and "missing.yaml: cannot read it" in err


def test_jobs_and_ray_address_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--policy", "default", "--jobs", "2", "--ray-address", "auto"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
