"""Grid files: the axes and shared settings, checked field by field, and the cells they make."""

from __future__ import annotations

from pathlib import Path

import pytest

from epick.simulate.fleet import ClosedLoop, Poisson
from epick.simulate.sweep.cell import FleetSpec, PolicySpec
from epick.simulate.sweep.grid import GridError, load_grid

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "simulate" / "grid.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return path


def test_the_sample_grid_loads_and_makes_its_cells() -> None:
    grid = load_grid(SAMPLE).relative_to(SAMPLE.parent)
    assert Path(grid.configs[0]).resolve() == ROOT / "config" / "load-only.yaml"
    names = [w.name for w in grid.workload_points()]
    assert names == [
        "shared-prefix",
        "long-system-prompts system-tokens=4000",
        "long-system-prompts system-tokens=8000",
    ]
    policies = [PolicySpec(n) for n in ("a", "b", "c", "d")]
    cells = grid.cells(policies, FleetSpec())
    assert len(cells) == 4 * 3 * 2 * 3 * 3 == 216
    first = cells[0]
    assert (first.policy.name, first.workload.name, first.fleet.servers, first.arrivals, first.seed) == (
        "a", "shared-prefix", 4, Poisson(10.0), 0
    )  # fmt: skip
    assert first.requests == 300 and first.fleet.engine_profile == "llama-3.1-8b-h100"
    # Seeds innermost, then policies, loads, fleet sizes, workloads outermost.
    assert [(c.policy.name, c.seed) for c in cells[:4]] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert cells[12].arrivals == Poisson(30.0) and cells[36].fleet.servers == 8
    assert dict(cells[72].workload.params)["system-tokens"] == 4000


def test_list_valued_parameters_are_axes(tmp_path: Path) -> None:
    grid = load_grid(
        write(
            tmp_path,
            "policies: [default]\nworkloads:\n"
            "- kind: sharegpt-like\n  params: {n: [10, 20], input-median: 50}\n"
            "- kind: lora-mix\n  name: loras\n  params: {adapters: [2, 4], zipf-s: [0.5, 1.0]}\n"
            "loads: {concurrency: [2, 4]}\n",
        )
    )
    points = grid.workload_points()
    assert [p.name for p in points] == [
        "sharegpt-like n=10", "sharegpt-like n=20",
        "loras adapters=2 zipf-s=0.5", "loras adapters=2 zipf-s=1.0",
        "loras adapters=4 zipf-s=0.5", "loras adapters=4 zipf-s=1.0",
    ]  # fmt: skip
    assert points[1].params == (("n", 20), ("input-median", 50))
    assert points[1].build().size == 20
    assert {c.arrivals for c in grid.cells([PolicySpec("default")], FleetSpec())} == {
        ClosedLoop(2),
        ClosedLoop(4),
    }


@pytest.mark.parametrize(
    ("text", "messages"),
    [
        ("policies: [default]\nloads: {qps: [5, -1]}\n", ["loads.qps.1: Input should be greater than 0"]),
        ("policies: [default]\nservers: 8\n", ["servers: Input should be a valid list"]),
        ("policies: [default]\nservrs: [8]\n", ["servrs: Extra inputs are not permitted"]),
        (
            "policies: [default]\nengine_profiles: [h100]\n",
            ["engine_profiles: unknown engine profile 'h100'"],
        ),
        (
            "policies: [default]\nmetric: latency\n",
            ["metric: unknown metric 'latency'; choose from ttft_p50"],
        ),
        ("loads: {qps: [5]}\n", ["give at least one entry under policies or configs"]),
        ("policies: [default]\nloads: {qps: [5], concurrency: [2]}\n", ["loads: give one of qps"]),
        ("policies: [default]\nloads: {qps: []}\n", ["loads: an empty list gives no point"]),
        (
            "policies: [default]\nservers: [4, 2]\nprefill_servers: 2\n",
            ["must be less than every fleet size"],
        ),
        ("policies: [default]\nrestart_downtime: 5\n", ["restart_downtime needs restart_every"]),
        (
            "policies: [default]\nworkloads: [{kind: shared-prefix, params: {groups: []}}]\n",
            ["workloads.0.params: parameter groups: an empty list gives no point"],
        ),
        (
            "policies: [default]\nworkloads: [{kind: shared-prefix}, {kind: shared-prefix}]\n",
            ["two workloads are named 'shared-prefix': give each a different name"],
        ),
        (
            "policies: [default]\nloads: {qps: [5]}\nworkloads: [{kind: trace, params: {path: t.jsonl}}]\n",
            ["loads.qps does not apply to a trace (trace)"],
        ),
        (
            "policies: [default]\nseeds: 0\nseed: x\n",
            ["2 invalid fields", "seeds: Input should be greater than 0"],
        ),
        ("- default\n", ["expected a mapping of settings"]),
        ("policies: [default\n", ["not valid YAML"]),
    ],
)
def test_a_bad_grid_names_its_file_and_every_bad_field(
    tmp_path: Path, text: str, messages: list[str]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(GridError) as raised:
        load_grid(path)
    assert str(raised.value).startswith(str(path))
    for message in messages:
        assert message in str(raised.value)


def test_a_missing_grid_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(GridError, match=r"nope\.yaml: cannot read it: No such file"):
        load_grid(tmp_path / "nope.yaml")


def test_paths_are_relative_to_the_grid_file(tmp_path: Path) -> None:
    grid = load_grid(
        write(
            tmp_path,
            "configs: [c.yaml, /abs/d.yaml]\nworkloads: [{kind: trace, params: {path: traces/t.jsonl}}]\n"
            "loads: {concurrency: [1]}\n",
        )
    )
    assert grid.configs == ["c.yaml", "/abs/d.yaml"]  # as written, for the JSON
    resolved = grid.relative_to(tmp_path)
    assert resolved.configs == [str(tmp_path / "c.yaml"), "/abs/d.yaml"]
    assert resolved.workloads[0].params["path"] == str(tmp_path / "traces" / "t.jsonl")
