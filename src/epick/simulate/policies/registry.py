"""The baseline policies by name: `POLICIES` maps each name to its factory, `factory(rng, **params)`."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from epick.simulate.policies.least_request import LeastRequest
from epick.simulate.policies.oracle_prefix import OraclePrefix
from epick.simulate.policies.prefix_random import PrefixRandom
from epick.simulate.policies.sglang_cache_aware import SGLangCacheAware
from epick.simulate.types import Policy

PolicyFactory = Callable[..., Policy]


def _least_request(rng: random.Random, **params: Any) -> Policy:
    return LeastRequest(rng, **params)


def _sglang(rng: random.Random, **params: Any) -> Policy:
    return SGLangCacheAware(rng, **params)


def _prefix_random(rng: random.Random, **params: Any) -> Policy:
    return PrefixRandom(rng, **params)


def _oracle(rng: random.Random, **params: Any) -> Policy:
    return OraclePrefix(rng, **params)


POLICIES: Mapping[str, PolicyFactory] = {
    "least-request": _least_request,
    "sglang-cache-aware": _sglang,
    "prefix-random": _prefix_random,
    "oracle-prefix": _oracle,
}
