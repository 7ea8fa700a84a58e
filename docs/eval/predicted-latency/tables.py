"""Print docs/evaluation.md (h)'s tables from the JSON next to this file.

python docs/eval/predicted-latency/tables.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
PEERS = ("sglang-cache-aware", "prefix-random", "oracle-prefix")
FILES = (
    "capacity",
    "capacity-kv19208",
    "multi-turn",
    "lora-mix",
    "sharegpt-like",
    "pd-aggregated",
    "pd-3",
    "pd-4",
)


def load_of(run: dict[str, object]) -> float:
    value = run.get("qps", run.get("concurrency"))
    assert isinstance(value, int | float)
    return float(value)


def main() -> None:
    for name in FILES:
        runs = json.loads((HERE / f"{name}.json").read_text())["runs"]
        print(f"\n{name}\n")
        print("| policy | QPS | output tok/s | TTFT p90 (s) | goodput (req/s) | hit rate |")
        print("|---|---:|---:|---:|---:|---:|")
        by_load: dict[float, list[dict[str, object]]] = {}
        for run in runs:
            by_load.setdefault(load_of(run), []).append(run)
        for load, group in sorted(by_load.items()):
            peers = [r for r in group if r["policy"] in PEERS]
            best_tp = max((float(r["output_tokens_per_s"]) for r in peers), default=0.0)
            for r in group:
                policy = str(r["policy"])
                label = f"**{policy}**" if policy.startswith("predicted-latency") else policy
                tp = float(r["output_tokens_per_s"])
                ratio = f" ({tp / best_tp:.3f})" if best_tp and policy.startswith("predicted") else ""
                ttft = r["ttft_s"]
                assert isinstance(ttft, dict)
                goodput, hits = float(r["goodput"]), float(r["prefix_cache_hit_rate"])
                p90 = float(ttft["p90"])
                print(f"| {label} | {load:g} | {tp:,.0f}{ratio} | {p90:.3f} | {goodput:.2f} | {hits:.1%} |")


if __name__ == "__main__":
    main()
