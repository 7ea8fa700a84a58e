"""A sweep's runs summed up: figures per point and policy with intervals, the best policy per point,
and the flips along each axis."""

from __future__ import annotations

import math
from typing import Any

import pytest

from epick.simulate.sweep.aggregate import ranking, stats, summary


def run(
    policy: str, qps: float, seed: int, ttft: float, *, servers: int = 8, hit: float = 0.5
) -> dict[str, Any]:
    """A run's summary with every figure the sweep reads; TTFT p90 `ttft`, hit rate `hit`."""
    return {
        "policy": policy,
        "qps": qps,
        "ttft_s": {"p50": ttft / 2, "p90": ttft, "p99": ttft * 2},
        "tpot_s": {"p50": 0.01, "p99": 0.02},
        "e2e_s": {"p50": 1.0, "p99": 2.0},
        "output_tokens_per_s": 100.0,
        "requests_per_s": qps,
        "prefix_cache_hit_rate": hit,
        "load_cov": 0.1,
        "goodput": qps,
        "goodput_share": 1.0,
        "failed": 0,
        "load_kind": "qps",
        "workload": "shared-prefix",
        "servers": servers,
        "engine_profile": "llama-3.1-8b-h100",
        "seed": seed,
    }


# Seed to seed the TTFT moves a lot (0.1 … 0.3); policy a is 0.01 faster than b on every seed at 5 req/s,
# b is 0.05 faster than a at 20, and at 40 they differ by noise (b 0.0007 faster on average).
SEED_LEVEL = {0: 0.1, 1: 0.3, 2: 0.2}
NOISE = {0: -0.004, 1: 0.003, 2: -0.001}


def grid_runs() -> list[dict[str, Any]]:
    runs = []
    for qps, gap in ((5.0, 0.01), (20.0, -0.05), (40.0, 0.0)):
        for policy in ("a", "b"):
            for seed, level in SEED_LEVEL.items():
                ttft = level + (gap if policy == "b" else 0.0)
                if qps == 40.0 and policy == "b":
                    ttft += NOISE[seed]
                runs.append(run(policy, qps, seed, ttft, hit=0.9 if policy == "a" else 0.5))
    return runs


def test_stats_give_each_figure_its_mean_interval_and_standing() -> None:
    rows = stats(grid_runs())
    assert [(r["qps"], r["policy"], r["seeds"]) for r in rows] == [
        (5.0, "a", [0, 1, 2]), (5.0, "b", [0, 1, 2]), (20.0, "a", [0, 1, 2]),
        (20.0, "b", [0, 1, 2]), (40.0, "a", [0, 1, 2]), (40.0, "b", [0, 1, 2]),
    ]  # fmt: skip
    a5, b5, a20, b20, a40, b40 = rows
    assert a5["figures"]["ttft_p90"]["mean"] == pytest.approx(0.2)
    low, high = a5["figures"]["ttft_p90"]["ci95"]
    assert low < 0.2 < high and high - 0.2 > 0.2  # the seeds spread 0.1 … 0.3: a wide interval
    assert (a5["figures"]["ttft_p90"]["vs_best"], b5["figures"]["ttft_p90"]["vs_best"]) == ("best", "worse")
    assert (a20["figures"]["ttft_p90"]["vs_best"], b20["figures"]["ttft_p90"]["vs_best"]) == ("worse", "best")
    assert (a40["figures"]["ttft_p90"]["vs_best"], b40["figures"]["ttft_p90"]["vs_best"]) == (
        "within noise",
        "best",
    )
    # Higher is better for the hit rate: a's 0.9 beats b's 0.5 at every load.
    assert {r["policy"] for r in rows if r["figures"]["prefix_cache_hit_rate"]["vs_best"] == "best"} == {"a"}


def test_one_seed_gives_no_interval_and_no_verdict_but_a_best() -> None:
    rows = stats([run("a", 5.0, 0, 0.1), run("b", 5.0, 0, 0.2)])
    assert rows[0]["figures"]["ttft_p90"] == {"mean": 0.1, "ci95": None, "vs_best": "best"}
    assert rows[1]["figures"]["ttft_p90"] == {"mean": 0.2, "ci95": None, "vs_best": None}


def test_summary_names_the_best_per_point_and_the_flips_along_the_load() -> None:
    s = summary(grid_runs(), "ttft_p90")
    assert s["metric"] == "ttft_p90" and s["higher_is_better"] is False
    assert [(p["qps"], p["best"], p["ranking"]) for p in s["points"]] == [
        (5.0, "a", ["a", "b"]),
        (20.0, "b", ["b", "a"]),
        (40.0, "b", ["b", "a"]),  # b's noise averages below a
    ]
    assert [p["within_noise_of_best"] for p in s["points"]] == [[], [], ["a"]]
    (flip,) = s["flips"]  # 5 → 20: a → b; 20 → 40: b stays best
    assert flip == {
        "axis": "load",
        "from": 5.0,
        "to": 20.0,
        "where": {"workload": "shared-prefix", "servers": 8, "engine_profile": "llama-3.1-8b-h100"},
        "best_before": "a",
        "best_after": "b",
        "within_noise": False,
    }


def test_flips_along_the_fleet_size_hold_the_load_fixed() -> None:
    runs = [run("a", 10.0, 0, 0.1, servers=4), run("b", 10.0, 0, 0.2, servers=4)]
    runs += [run("a", 10.0, 0, 0.3, servers=8), run("b", 10.0, 0, 0.2, servers=8)]
    (flip,) = summary(runs, "ttft_p90")["flips"]
    assert (flip["axis"], flip["from"], flip["to"], flip["best_before"], flip["best_after"]) == (
        "servers", 4, 8, "a", "b"
    )  # fmt: skip
    assert flip["where"]["qps"] == 10.0 and flip["within_noise"] is None  # one seed: cannot tell


def test_a_policy_with_no_figure_ranks_last() -> None:
    nan = run("a", 5.0, 0, math.nan)
    policies = {"a": [nan], "b": [run("b", 5.0, 0, 9.0)], "c": [run("c", 5.0, 0, 1.0)]}
    assert ranking(policies, "ttft_p90") == ["c", "b", "a"]
    assert ranking(policies, "goodput") == ["a", "b", "c"]  # all equal: the order given
