"""When the batch (-10) requests of an `epick simulate` run got their first token: in the first 10 s,
between then and the last arrival, or after the arrivals stopped (docs/evaluation.md, "(e) Overload:
flow control"). Takes `epick simulate`'s arguments and runs it, printing one line per run:

    .venv/bin/python docs/eval/flow-control-batch-timing.py --config config/flow-control.yaml \
        --policy default $W --qps-sweep 187.5,375
"""

import sys

from epick.cli import simulate
from epick.cli.main import main

summarize = simulate.summarize


def timing(name, load, result, slo):  # type: ignore[no-untyped-def]
    records = result.records
    last_arrival = max(r.arrival for r in records)
    batch = [r for r in records if r.priority == -10 and r.failed is None and r.first_token is not None]
    early = sum(r.first_token < 10 for r in batch)
    after = sum(r.first_token > last_arrival for r in batch)
    during = len(batch) - early - after
    print(
        f"{name} @ {load:g}: last arrival {last_arrival:.1f} s; {len(batch)} batch requests completed, "
        f"first token in the first 10 s: {early}, from 10 s to the last arrival: {during}, "
        f"after the last arrival: {after}",
        flush=True,
    )
    return summarize(name, load, result, slo)


simulate.summarize = timing
sys.exit(main(["simulate", *sys.argv[1:]]))
