"""`max-score-picker`: the highest totals win; ties are broken at random.

The Go EPP shuffles, sorts stably by total descending and takes the first `maxNumOfEndpoints`.
Sorting by (total descending, a random key) orders ties just as uniformly, and for one target a
single pass (the maximum, then a random one of its ties) does the same without sorting at all.

Deviation, under `epick serve --workers N` only: ties are broken by the prompt instead (rendezvous
hashing of the prompt's start and each endpoint's name), so every worker breaks the same tie the
same way. A prompt no endpoint holds scores alike everywhere, and two workers that see a new prompt's
first requests at once would otherwise place it on two endpoints. Different prompts still spread
evenly over tied endpoints.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import xxhash

from epick.framework import (
    CycleState,
    InferenceRequest,
    NamedPlugin,
    ProfileRunResult,
    Reads,
    ScoredEndpoint,
    split_scored,
)
from epick.plugins.pickers.params import PickerParameters
from epick.plugins.registry import Handle, PluginSpec

TYPE = "max-score-picker"


class MaxScorePicker(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # scores, and a random tie-break

    def __init__(
        self,
        name: str | None = None,
        max_num_of_endpoints: int = 1,
        rng: random.Random | None = None,
        workers: int = 1,
    ):
        """`workers`: how many worker processes pick with copies of this picker; above 1, ties are
        broken by the prompt, alike in every copy, not at random."""
        super().__init__(name)
        self.max_num_of_endpoints = max_num_of_endpoints
        self._rng = rng or random.Random()
        self._by_prompt = workers > 1

    def pick(
        self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> ProfileRunResult:
        endpoints, scores = split_scored(scored)
        if not endpoints:
            return ProfileRunResult(())
        k = self.max_num_of_endpoints
        if k == 1:
            best = max(scores)
            if scores.count(best) == 1:
                return ProfileRunResult((endpoints[scores.index(best)],))
            ties = [i for i, s in enumerate(scores) if s == best]
            if self._by_prompt:
                key = _prompt_key(request)
                return ProfileRunResult((endpoints[max(ties, key=lambda i: _rank(key, endpoints[i].name))],))
            return ProfileRunResult((endpoints[ties[self._rng.randrange(len(ties))]],))
        if self._by_prompt:
            key = _prompt_key(request)
            order = sorted(range(len(endpoints)), key=lambda i: (-scores[i], -_rank(key, endpoints[i].name)))
        else:
            tiebreak = self._rng.random
            order = sorted(range(len(endpoints)), key=lambda i: (-scores[i], tiebreak()))
        return ProfileRunResult(tuple(endpoints[i] for i in order[:k]))


def _prompt_key(request: InferenceRequest) -> bytes:
    """What requests of one prompt share: the model and the prompt's first 256 characters."""
    return f"{request.target_model}\0{request.body.prefix_text[:256]}\0".encode()


def _rank(key: bytes, endpoint: str) -> int:
    """The endpoint's rank for this prompt, the same in every process (not Python's salted hash)."""
    return xxhash.xxh64_intdigest(key + endpoint.encode())


def _factory(name: str, params: PickerParameters, handle: Handle) -> MaxScorePicker:
    return MaxScorePicker(name, params.max_num_of_endpoints, handle.rng(name), workers=handle.workers)


SPEC = PluginSpec(
    TYPE, _factory, PickerParameters, "highest weighted total wins, random tie-break", worker_state=""
)
