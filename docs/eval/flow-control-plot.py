"""Draw docs/eval/flow-control-by-priority.png from docs/eval/flow-control.json (docs/evaluation.md,
"(e) Overload: flow control"): per load and policy, TTFT p99 of the interactive (10) and standard (0)
priorities, the batch (-10) completion, and Jain's index over the tenants' served shares.

    .venv/bin/python docs/eval/flow-control-plot.py
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
runs = json.loads((HERE / "flow-control.json").read_text())["runs"]
policies = list(dict.fromkeys(r["policy"] for r in runs))
loads = sorted({r["qps"] for r in runs})
by = {(r["policy"], r["qps"]): r for r in runs}
panels = [
    ("interactive (10) TTFT p99 (s)", lambda r: r["by_priority"]["10"]["ttft_s"]["p99"], True),
    ("standard (0) TTFT p99 (s)", lambda r: r["by_priority"]["0"]["ttft_s"]["p99"], True),
    ("batch (-10) completion", lambda r: r["by_priority"]["-10"]["completion"], False),
    ("Jain's index over tenants' shares", lambda r: r["fairness_jain"], False),
]
fig, axes = plt.subplots(1, len(panels), figsize=(16, 3.8))
width = 0.8 / len(policies)
for ax, (title, value, log) in zip(axes, panels, strict=True):
    for i, policy in enumerate(policies):
        xs = [j + (i - (len(policies) - 1) / 2) * width for j in range(len(loads))]
        ax.bar(xs, [value(by[policy, q]) for q in loads], width, label=policy)
    ax.set_xticks(range(len(loads)), [f"{q:g} QPS" for q in loads])
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="upper center", ncol=len(policies), fontsize=9)
fig.tight_layout(rect=(0, 0, 1, 0.9))
fig.savefig(HERE / "flow-control-by-priority.png", dpi=110)
