"""Draws eval/precise/delay.png (KV-event delay), eval/precise/ladder.png (llm-d's ladder
replayed) and eval/precise/churn.png (the ladder with servers restarting) from the JSON of
docs/evaluation.md section (f).

    python docs/eval/precise/plots.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
DELAYS = ["0", "0.01", "0.1", "1.0"]


def runs(name: str) -> list[dict]:
    return json.loads((HERE / f"{name}.json").read_text())["runs"]


def delay_plot() -> None:
    data = {d: runs(f"delay-{d}") for d in DELAYS}
    policies = list(dict.fromkeys(r["policy"] for r in data["0"]))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    xs = [0.001, 0.01, 0.1, 1.0]  # 0 drawn at 1 ms on the log axis
    for qps, style in ((30.0, "--"), (60.0, "-")):
        for i, policy in enumerate(policies):
            rows = [next(r for r in data[d] if r["policy"] == policy and r["qps"] == qps) for d in DELAYS]
            kw = dict(color=f"C{i}", linestyle=style, marker="o", label=f"{policy} @ {qps:g} QPS")
            axes[0].plot(xs, [r["ttft_s"]["p90"] for r in rows], **kw)
            axes[1].plot(xs, [r["output_tokens_per_s"] for r in rows], **kw)
            axes[2].plot(xs, [100 * r["prefix_cache_hit_rate"] for r in rows], **kw)
    for ax, title in zip(axes, ("TTFT p90 (s)", "output tokens/s", "prefix hit rate (%)"), strict=True):
        ax.set_xscale("log")
        ax.set_xticks(xs, ["0", "0.01", "0.1", "1"])
        ax.set_xlabel("--kv-event-delay (s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[2].legend(fontsize=7)
    fig.suptitle("73-capacity shape, 19,208 blocks per server")
    fig.tight_layout()
    fig.savefig(HERE / "delay.png", dpi=110)


def bar_panels(names: list[tuple[str, str]], policies: list[str], title: str, out: str) -> None:
    """TTFT p90, output tokens/s and hit rate per policy, one bar per run file (`names`: file, label)."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    width = 0.8 / len(names)
    for k, (name, label) in enumerate(names):
        rows = {r["policy"]: r for r in runs(name)}
        x = [i + (k - (len(names) - 1) / 2) * width for i in range(len(policies))]
        axes[0].bar(x, [rows[p]["ttft_s"]["p90"] for p in policies], width, label=label)
        axes[1].bar(x, [rows[p]["output_tokens_per_s"] for p in policies], width, label=label)
        axes[2].bar(x, [100 * rows[p]["prefix_cache_hit_rate"] for p in policies], width, label=label)
    for ax, panel in zip(axes, ("TTFT p90 (s)", "output tokens/s", "prefix hit rate (%)"), strict=True):
        ax.set_xticks(range(len(policies)), policies, rotation=60, ha="right", fontsize=8)
        ax.set_title(panel)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(HERE / out, dpi=110)


def ladder_plot() -> None:
    names = [("ladder-kv19208", "19,208 blocks"), ("ladder-kv9600", "9,600 blocks")]
    policies = [r["policy"] for r in runs(names[0][0])]
    title = "llm-d's 73-capacity ladder, prompts recurring (15 QPS x 50 s, then 10/20/30/40 QPS x 30 s)"
    bar_panels(names, policies, title, "ladder.png")


def churn_plot() -> None:
    names = [
        ("ladder-kv19208", "no restarts"),
        ("churn-every60", "every 60 s, unnoticed"),
        ("churn-every20", "every 20 s, unnoticed"),
        ("churn-every20-down10", "every 20 s, 10 s out of the pool"),
    ]
    policies = [r["policy"] for r in runs(names[1][0])]
    title = "llm-d's ladder at 19,208 blocks per server, servers restarting in turn"
    bar_panels(names, policies, title, "churn.png")


if __name__ == "__main__":
    delay_plot()
    ladder_plot()
    churn_plot()
