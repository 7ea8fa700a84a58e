"""Baseline routing policies that no epick config expresses: what other routers do, for `epick simulate`.

Each policy implements `epick.simulate.types.Policy`: `route` returns the chosen server's
`ServerView.index`. All randomness comes from the `random.Random` a policy is built with, so a seeded
run is reproducible. Every policy here reads only what the router it imitates could know: the
router-counted in-flight requests (`ServerView.in_flight`), the last scrape (`waiting`, `kv_usage`),
and its own past decisions — except `OraclePrefix`, which reads the engines' exact cache contents on
purpose.

`POLICIES` maps a policy's name to its factory, `factory(rng, **params)`.

One module per policy: `least_request` (`LeastRequest`), `sglang_cache_aware` (`SGLangCacheAware`),
`prefix_random` (`PrefixRandom`), `oracle_prefix` (`OraclePrefix`); `registry` holds `POLICIES`.
"""

from epick.simulate.policies.least_request import LeastRequest
from epick.simulate.policies.oracle_prefix import OraclePrefix
from epick.simulate.policies.prefix_random import PrefixRandom
from epick.simulate.policies.registry import POLICIES, PolicyFactory
from epick.simulate.policies.sglang_cache_aware import SGLangCacheAware

__all__ = [
    "POLICIES",
    "LeastRequest",
    "OraclePrefix",
    "PolicyFactory",
    "PrefixRandom",
    "SGLangCacheAware",
]
