"""Draws eval/profiles/llmd-ratios.png from the JSON of docs/evaluation.md section (g): each policy's
output tokens/s over random's, simulated on the matching engine profile, beside llm-d's published ratio.

    python docs/eval/profiles/plots.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
# llm-d's published output tokens/s over random (docs/evaluation.md section (g) cites each).
PUBLISHED = {
    "ladder-qwen32b": {"precise-prefix": 1.971, "estimated": 1.568, "load-only": 0.963},
    "cap37-llama70b": {"precise-prefix": 1.951, "approx-112": 1.760, "load-only": 1.042},
}
TITLES = {
    "ladder-qwen32b": "73-capacity ladder, Qwen3-32B TP2 (8 servers)",
    "cap37-llama70b": "37-capacity, Llama-3.1-70B TP4 (4 servers), 20 QPS",
}


def ratios(name: str) -> dict[str, float]:
    runs = json.loads((HERE / f"{name}.json").read_text())["runs"]
    top = max(r["qps"] or 0 for r in runs)
    rows = {r["policy"]: r for r in runs if (r["qps"] or 0) == top}
    floor = rows["random"]["output_tokens_per_s"]
    return {policy: r["output_tokens_per_s"] / floor for policy, r in rows.items() if policy != "random"}


def main() -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, name in zip(axes, PUBLISHED, strict=True):
        simulated = ratios(name)
        policies = list(PUBLISHED[name])
        xs = range(len(policies))
        ax.bar([x - 0.2 for x in xs], [simulated[p] for p in policies], width=0.4, label="epick simulate")
        ax.bar([x + 0.2 for x in xs], [PUBLISHED[name][p] for p in policies], width=0.4, label="llm-d published")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(list(xs), policies)
        ax.set_ylabel("output tokens/s ÷ random")
        ax.set_title(TITLES[name], fontsize=10)
        ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "llmd-ratios.png", dpi=110)


if __name__ == "__main__":
    main()
