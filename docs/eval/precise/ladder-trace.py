"""Writes llm-d's 73-capacity benchmark load as an `epick simulate` trace.

The shape of llm-d/llm-d-kv-cache benchmarking/73-capacity/README.md: inference-perf's
shared_prefix data (150 groups x 5 prompts, a 6,000-token system prompt, a 1,200-token question,
1,000 output tokens), its prompts shuffled once and then sent in that order over and over (as
inference-perf's SharedPrefixDataGenerator does: request i gets prompt i mod 750), under its
Poisson ladder: a 15 QPS warm-up for 50 s, then 3, 10, 15, 20, ..., 60 QPS. Unlike the
`shared-prefix` workload, which sends each prompt once, every prompt here recurs about 23 times,
question included. Prompts are `prompt_block_ids` (16 tokens each).

    python docs/eval/precise/ladder-trace.py [--seed 1] [--stages 15:50,5:30,10:30] > /tmp/ladder.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys

SHAPES = {
    # groups, prompts per group, system tokens, question tokens, output tokens, stages (QPS, s)
    "73": (150, 5, 6000, 1200, 1000, [(15, 50), (3, 20), (10, 20), (15, 20), (20, 38), (22, 34),
                                      (25, 30), (30, 25), (35, 21), (40, 38), (43, 36), (46, 33),
                                      (49, 30), (52, 29), (55, 27), (57, 26), (60, 25)]),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="73", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stages", help="QPS:seconds,... instead of llm-d's ladder (e.g. 15:50,5:30,10:30)")
    args = ap.parse_args()
    groups, per_group, system, question, output, stages = SHAPES[args.shape]
    if args.stages:
        stages = [(float(q), float(d)) for q, d in (x.split(":") for x in args.stages.split(","))]
    rng = random.Random(args.seed)
    bs = 16
    sys_blocks, q_blocks = system // bs, question // bs
    prompts = []
    for g in range(groups):
        shared = [1_000_000 + g * sys_blocks + k for k in range(sys_blocks)]
        for p in range(per_group):
            n = g * per_group + p
            prompts.append(shared + [10_000_000 + n * q_blocks + k for k in range(q_blocks)])
    rng.shuffle(prompts)
    t, i, out = 0.0, 0, sys.stdout
    start = 0.0
    for qps, duration in stages:
        t = start
        while True:
            t += rng.expovariate(qps)
            if t >= start + duration:
                break
            out.write(json.dumps({"arrival": round(t, 6), "prompt_block_ids": prompts[i % len(prompts)],
                                  "output_tokens": output}, separators=(",", ":")) + "\n")
            i += 1
        start += duration
    print(f"{i} requests over {start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
