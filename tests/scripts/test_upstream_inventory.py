"""scripts/upstream-inventory: the differences it reports between a small llm-d-router-shaped fixture tree
(tests/data/inventory/router) and a small catalogue standing in for epick's (catalogue.json)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "upstream-inventory"
DATA = REPO / "tests" / "data" / "inventory"
ROUTER = DATA / "router"
CATALOGUE = DATA / "catalogue.json"
MIRROR = Path("/work/.mirror/llm-d+llm-d-router/repo")


@pytest.fixture(scope="module")
def inventory() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("upstream_inventory", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


def run(inventory: ModuleType, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = inventory.main(["--catalogue", str(CATALOGUE), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def as_json(inventory: ModuleType, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    rc, out, _ = run(inventory, capsys, "--llm-d-router", str(ROUTER), "--json", *argv)
    assert rc == 0
    document: dict[str, Any] = json.loads(out)
    return document


def diff_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:2] in ("+ ", "~ ", "- ")]


def test_the_report_lists_each_difference(inventory: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(inventory, capsys, "--llm-d-router", str(ROUTER))
    assert (rc, err) == (0, "")
    assert diff_lines(out) == [
        "+ new plugin type foo-filter (alpha, pkg/epp/framework/plugins/scheduling/filter/foo)",
        "~ changed stability bar-scorer: alpha -> beta",
        "- gone plugin type baz-scorer (epick still lists it)",
        "+ new feature gate speculativeDecoding (default true, pkg/epp/server)",
        "+ new flag --replay-header (string, default x-replay, pkg/epp/server/options.go)",
        "~ changed default drain-timeout: 30s -> 45s",
        "- gone flag --old-flag (epick still lists it)",
        "+ new config field flowControl.priorityBands[].defaultRequestTTL (v1alpha1)",
        "- not upstream: config field data (epick's schema accepts it)",
        "+ new metric llm_d_epp_scheduler_info (gauge, labels [], pkg/epp/metrics/metrics.go)",
        "~ changed labels llm_d_epp_request_duration_seconds: "
        "[model_name, target_model_name, fairness_id, priority] -> "
        "[model_name, target_model_name, fairness_id, priority, streaming]",
        "- gone metric llm_d_epp_old_metric (epick's catalogue still lists it)",
    ]
    summaries = [line for line in out.splitlines() if line.split(":")[0] in inventory.SECTIONS]
    assert summaries == [
        "plugins: 6 plugin types upstream, 6 in epick; 1 new, 1 changed, 1 gone",
        "gates: 2 feature gates upstream, 1 in epick; 1 new, 0 changed, 0 gone",
        "flags: 10 flags upstream, 11 in epick; 1 new, 1 changed, 1 gone, 1 kept",
        "config: 12 config fields upstream, 12 in epick; 1 new, 0 changed, 1 only in epick",
        "metrics: 9 metrics upstream, 9 in epick; 1 new, 1 changed, 1 gone",
    ]
    assert "= kept zap-devel: controller-runtime's, bound outside the tree" in out
    assert "! bar-scorer is registered twice (cmd/epp/runner/runner.go lines 29 and 34)" in out


def test_the_json_document(inventory: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    document = as_json(inventory, capsys)
    assert document["llm_d_router"] == str(ROUTER)
    sections = document["sections"]
    assert list(sections) == ["plugins", "gates", "flags", "config", "metrics"]

    plugins = sections["plugins"]
    assert [p["name"] for p in plugins["new"]] == ["foo-filter"]
    assert plugins["changed"] == [
        {"name": "bar-scorer", "field": "stability", "upstream": "beta", "epick": "alpha"}
    ]
    assert [p["name"] for p in plugins["gone"]] == ["baz-scorer"]
    registered = {p["name"]: p for p in plugins["upstream"]}
    # Outside registerInTreePlugins, and commented out: not plugin types.
    assert "outside-filter" not in registered and "commented-out" not in registered
    assert registered["by-label"] | {"line": 0} == {
        "name": "by-label",
        "stability": "beta",
        "package": "pkg/epp/framework/plugins/scheduling/filter/bylabel",
        "deprecated_in": "v0.9.0",
        "removal_in": "v0.11.0",
        "replacement": "label-selector-filter",
        "test_only": False,
        "line": 0,
    }
    # A constant built from another package's constant; a default producer's data key is not a type.
    assert "prefix-cache-scorer-producer" in registered

    assert sections["gates"]["new"] == [
        {"name": "speculativeDecoding", "default": True, "package": "pkg/epp/server"}
    ]

    flags = sections["flags"]
    assert [f["name"] for f in flags["new"]] == ["replay-header"]
    assert flags["changed"] == [
        {"name": "drain-timeout", "field": "default", "upstream": 45.0, "epick": 30.0, "kind": "duration"}
    ]
    assert [f["name"] for f in flags["gone"]] == ["old-flag"]
    read = {f["name"]: f for f in flags["upstream"]}
    # A field the constructor leaves out is Go's zero value, whatever another struct's literal says.
    assert read["health-checking"]["default"] is False
    assert read["v"]["shorthand"] == "v" and read["v"]["default"] == 2
    assert read["drain-timeout"]["usage"] == "Graceful shutdown drain window in seconds."
    assert read["endpoint-target-ports"] == read["endpoint-target-ports"] | {
        "kind": "intSlice",
        "default": [],
    }

    config = sections["config"]
    assert config["upstream"] == {
        "v1alpha1": [
            "apiVersion",
            "featureGates",
            "flowControl",
            "flowControl.maxBytes",
            "flowControl.priorityBands",
            "flowControl.priorityBands[].defaultRequestTTL",
            "flowControl.priorityBands[].priority",
            "kind",
            "plugins",
            "plugins[].name",
            "plugins[].parameters",
            "plugins[].type",
        ]
    }
    assert config["new"] == [
        {"name": "flowControl.priorityBands[].defaultRequestTTL", "versions": ["v1alpha1"]}
    ]
    assert config["gone"] == [{"name": "data"}]

    metrics = sections["metrics"]
    assert [m["name"] for m in metrics["new"]] == ["llm_d_epp_scheduler_info"]
    assert [(c["name"], c["field"]) for c in metrics["changed"]] == [
        ("llm_d_epp_request_duration_seconds", "labels")
    ]
    assert [m["name"] for m in metrics["gone"]] == ["llm_d_epp_old_metric"]
    assert metrics["notes"] == []
    families = {m["name"]: m for m in metrics["upstream"]}
    # A Desc's type comes from the collector that builds const metrics with it, in another package.
    assert families["llm_d_epp_per_endpoint_queue_size"]["type"] == "gauge"
    # Both families a helper builds from its parameters, one per call; the old one marked deprecated.
    assert (
        families["kvcache_index_admissions_total"]["deprecated"]
        == "llm_d_epp_kv_cache_index_admissions_total"
    )
    assert families["llm_d_epp_kv_cache_index_admissions_total"]["deprecated"] is None
    assert families["llm_d_epp_kv_cache_index_lookup_latency_seconds"]["buckets"][-1] == 10.0
    assert families["inference_objective_request_total"]["deprecated"] == "llm_d_epp_request_total"
    assert families["llm_d_epp_flow_control_queue_bytes"]["labels"] == [
        "fairness_id",
        "priority",
        "inference_pool",
        "model_name",
        "target_model_name",
    ]


def test_one_section(inventory: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    document = as_json(inventory, capsys, "--section", "gates")
    assert list(document["sections"]) == ["gates"]
    rc, out, _ = run(inventory, capsys, "--llm-d-router", str(ROUTER), "--section", "plugins")
    assert rc == 0 and "== plugins" in out and "== flags" not in out


def test_gie_and_kv_cache_are_listed_under_their_own_headings(
    inventory: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    gie, kv = str(DATA / "gie"), str(DATA / "kv-cache")
    rc, out, _ = run(inventory, capsys, "--llm-d-router", str(ROUTER), "--gie", gie, "--kv-cache", kv)
    assert rc == 0
    tail = out[out.index("== gie") :].splitlines()
    assert tail == [
        f"== gie: {gie}",
        "gie flags: 2 found, 1 not in epick's catalogue",
        "  + lwepp-pool",
        "gie config: 0 found, 0 not in epick's catalogue",
        "gie metrics: 0 found, 0 not in epick's catalogue",
        "",
        f"== kv-cache: {kv}",
        "kv-cache metrics: 2 found, 1 not in epick's catalogue",
        "  + kvcache_tokenization_tokenization_latency_seconds (histogram)",
    ]
    document = as_json(inventory, capsys, "--gie", gie, "--kv-cache", kv)
    assert document["gie"]["flags_not_in_epick"] == ["lwepp-pool"]
    assert [m["name"] for m in document["kv_cache"]["metrics"]] == [
        "kvcache_index_admissions_total",
        "kvcache_tokenization_tokenization_latency_seconds",
    ]


def test_a_tree_without_runner_go_exits_2(inventory: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(inventory, capsys, "--llm-d-router", str(DATA / "no-runner"))
    assert (rc, out) == (2, "")
    assert err == (
        f"upstream-inventory: {DATA / 'no-runner'} is not an llm-d-router tree: "
        "cmd/epp/runner/runner.go is missing\n"
    )
    rc, _, err = run(inventory, capsys, "--llm-d-router", str(DATA / "nowhere"))
    assert rc == 2 and "no such directory" in err


def test_run_as_a_command() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--llm-d-router",
            str(DATA / "no-runner"),
            "--catalogue",
            str(CATALOGUE),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "cmd/epp/runner/runner.go is missing" in done.stderr
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--llm-d-router", str(ROUTER), "--catalogue", str(CATALOGUE), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert json.loads(done.stdout)["sections"]["gates"]["new"][0]["name"] == "speculativeDecoding"


def _git(cwd: Path, *args: str) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    done = subprocess.run(["git", *env_args, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_bare_git_dir_at_a_revision(
    inventory: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    shutil.copytree(ROUTER, work)
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "fixture")
    runner = work / "cmd" / "epp" / "runner" / "runner.go"
    runner.write_text(runner.read_text().replace("\tfwkplugin.Register(foo.FooFilterType", "\t// gone: foo"))
    _git(work, "commit", "-q", "-am", "drop foo-filter")
    bare = tmp_path / "bare.git"
    _git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))

    head = as_json(inventory, capsys, "--llm-d-router", str(bare))  # later option wins
    assert head["llm_d_router"].startswith(f"{bare} at HEAD (")
    assert head["sections"]["plugins"]["new"] == []

    before = as_json(inventory, capsys, "--llm-d-router", str(bare), "--revision", "HEAD~1")
    on_disk = as_json(inventory, capsys)
    assert before["sections"] == on_disk["sections"]
    # A work tree read at a revision through its own git.
    from_work = as_json(inventory, capsys, "--llm-d-router", str(work), "--revision", "HEAD~1")
    assert from_work["sections"] == on_disk["sections"]

    rc, _, err = run(inventory, capsys, "--llm-d-router", str(bare), "--revision", "no-such-rev")
    assert rc == 2 and "unknown revision 'no-such-rev'" in err
    rc, _, err = run(inventory, capsys, "--llm-d-router", str(ROUTER), "--revision", "HEAD")
    assert rc == 2 and ".git is missing" in err


def test_the_evaluator(inventory: ModuleType) -> None:
    assert inventory.split_top("1e+3 + x", "+") == ["1e+3", "x"]
    assert inventory.split_top('f(a, "b,c"), d', ",") == ['f(a, "b,c")', "d"]
    # Comments become spaces (offsets kept); a comment marker inside a string is no comment.
    assert inventory.blank_comments('a // "x"\n"// y" /* z */') == "a" + " " * 7 + '\n"// y" ' + " " * 7
    repo = inventory.Repo(inventory.DiskTree(ROUTER))
    runner = repo.go_file("pkg/epp/server/options.go")
    assert repo.evaluate("DefaultDrainTimeout", runner) == 45.0
    assert repo.evaluate("3 * time.Minute / 2", runner) == 90.0
    assert repo.evaluate("float64(2) * 0.25", runner) == 0.5
    assert repo.evaluate('"a" + `b`', runner) == "ab"
    assert repo.evaluate("logging.DEFAULT", runner) == 2
    assert repo.evaluate("time.Now()", runner) == inventory.Unresolved("time.Now()")
    assert inventory.plain([1, inventory.Unresolved("x.Y")]) == [1, "<x.Y>"]


def test_epicks_own_catalogue(inventory: ModuleType) -> None:
    from epick.cli.epp_flags import UPSTREAM_FLAGS
    from epick.config.upstream import FEATURE_GATES, UPSTREAM_TYPES

    catalogue = inventory.load_epick_catalogue()
    assert [p["name"] for p in catalogue["plugins"]] == [t.name for t in UPSTREAM_TYPES]
    assert [g["name"] for g in catalogue["gates"]] == [g.name for g in FEATURE_GATES]
    assert [f["name"] for f in catalogue["flags"]] == [f.name for f in UPSTREAM_FLAGS]
    kept = {f["name"] for f in catalogue["flags"] if f.get("kept")}
    assert {"zap-devel", "model-server-metrics-port"} <= kept
    assert {"apiVersion", "plugins[].type", "flowControl.priorityBands[].priority"} <= set(
        catalogue["config"]
    )
    assert len(catalogue["metrics"]) > 100


@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the llm-d-router mirror")
def test_the_real_tree_is_read_without_gaps(
    inventory: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """At ebab687 every type, gate, flag default and metric resolves; how many differences epick's
    catalogue shows depends on how far it has moved since, so only the reading is checked here."""
    rc = inventory.main(["--llm-d-router", str(MIRROR), "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    sections = json.loads(out)["sections"]
    assert len(sections["plugins"]["upstream"]) >= 90
    assert all("registered twice" in n for n in sections["plugins"]["notes"])
    assert sections["gates"]["notes"] == [] and len(sections["gates"]["upstream"]) >= 2
    assert all(n.startswith("zap-*") for n in sections["flags"]["notes"])
    assert sections["metrics"]["notes"] == [] and len(sections["metrics"]["upstream"]) >= 130
    assert "flowControl.priorityBands[].priority" in sections["config"]["upstream"]["v1alpha1"]
