"""Where a batch of requests goes, so that requests sharing a prompt prefill it once: the placement
rule of upstream's `burst-prefix-cache-producer` (llm-d/llm-d-router,
pkg/epp/framework/plugins/requestcontrol/dataproducer/burstprefix/assign.go).

1. Requests are grouped by their whole chain of block hashes (equal chains: the same prompt, up to
   the block cap). A request without blocks gets no affinity. The batch places on the candidates of
   its first request with blocks.
2. A group of two or more is a unit. With `min_colocate_blocks` > 0 a lone request is a unit too when
   other requests of the batch share its first `min_colocate_blocks` blocks; otherwise it gets no
   affinity.
3. Units are placed groups first, then lone requests, each tier longest prompt first. The fair share
   of a replica is ceil(total / replicas), the total in requests (`by_tokens` false) or in blocks.
4. A unit goes to the replica holding most of its prefix (only with `min_colocate_blocks` > 0, and
   only replicas under the fair share, under `max_per_replica` and holding at least that many
   blocks), else to the least loaded. Least loaded is by this batch's load, then running requests,
   then name. `max_per_replica` (-1: no cap) spreads a group: each replica takes what its cap leaves,
   and at least one when every replica is full.
5. With `by_tokens`, a replica's load is the blocks it must prefill: a unit's blocks, less those
   it already holds, charged once per replica.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from epick.framework import Endpoint

UNLIMITED = -1


@dataclass(eq=False, slots=True)
class BurstEntry:
    """One request in a batch: its prompt's chained block hashes and its candidates; `assigned` is
    set by `assign` (None: no affinity)."""

    hashes: tuple[int, ...]
    endpoints: Sequence[Endpoint]
    assigned: Endpoint | None = field(default=None)


def assign(
    entries: Sequence[BurstEntry], max_per_replica: int, min_colocate_blocks: int, by_tokens: bool
) -> None:
    groups: dict[tuple[int, ...], list[BurstEntry]] = {}
    replicas: Sequence[Endpoint] = ()
    for entry in entries:
        if not entry.hashes:
            continue
        if not groups:
            replicas = entry.endpoints
        groups.setdefault(entry.hashes, []).append(entry)
    if not replicas:
        return
    shared = _shared(groups, min_colocate_blocks)
    whole = [key for key, members in groups.items() if len(members) >= 2]
    lone = [key for key, members in groups.items() if len(members) == 1 and key in shared]
    if not whole and not lone:
        return
    whole.sort(key=len, reverse=True)  # stable: equal lengths keep their arrival order
    lone.sort(key=len, reverse=True)
    units = whole + lone
    total = sum(len(key) for key in units) if by_tokens else sum(len(groups[key]) for key in units)
    placer = _Placer(
        replicas, max_per_replica, min_colocate_blocks, math.ceil(total / len(replicas)), by_tokens
    )
    for key in units:
        placer.place(groups[key])


def _shared(groups: dict[tuple[int, ...], list[BurstEntry]], min_blocks: int) -> set[tuple[int, ...]]:
    """The prompts with at least `min_blocks` blocks whose first `min_blocks` blocks two or more
    requests of the batch share (none when `min_blocks` is 0)."""
    if min_blocks <= 0:
        return set()
    heads: Counter[tuple[int, ...]] = Counter()
    for key, members in groups.items():
        if len(key) >= min_blocks:
            heads[key[:min_blocks]] += len(members)
    return {key for key in groups if len(key) >= min_blocks and heads[key[:min_blocks]] >= 2}


class _Placer:
    def __init__(
        self, replicas: Sequence[Endpoint], cap: int, min_blocks: int, fair_share: int, by_tokens: bool
    ) -> None:
        self.replicas = replicas
        self.cap = cap
        self.min_blocks = min_blocks
        self.fair_share = fair_share
        self.by_tokens = by_tokens
        self.load: Counter[str] = Counter()
        self.holders: dict[int, set[str]] = {}  # block hash -> replicas this batch sent it to

    def held(self, hashes: tuple[int, ...]) -> Counter[str]:
        """Per replica, how many leading blocks of `hashes` this batch has already sent it."""
        found: Counter[str] = Counter()
        for h in hashes:
            holders = self.holders.get(h)
            if not holders:
                break
            for name in holders:
                found[name] += 1
        return found

    def place(self, members: list[BurstEntry]) -> None:
        hashes = members[0].hashes
        prefer = self.min_blocks > 0
        matches = self.held(hashes) if prefer or self.by_tokens else Counter()
        taken: Counter[str] = Counter()
        i = 0
        while i < len(members):
            target = self.pick(taken, matches, prefer)
            run = len(members) - i
            if self.cap != UNLIMITED:
                run = min(run, max(1, self.cap - taken[target.name]))
            for member in members[i : i + run]:
                member.assigned = target
            first = taken[target.name] == 0
            taken[target.name] += run
            if not self.by_tokens:
                self.load[target.name] += run
            elif first:
                self.load[target.name] += max(0, len(hashes) - matches[target.name])
            i += run
            prefer = False  # only the first replica of a unit is chosen for what it holds
        for member in members:
            if member.assigned is not None:
                for h in hashes:
                    self.holders.setdefault(h, set()).add(member.assigned.name)

    def pick(self, taken: Counter[str], matches: Counter[str], prefer: bool) -> Endpoint:
        def under_cap(ep: Endpoint) -> bool:
            return self.cap == UNLIMITED or taken[ep.name] < self.cap

        def least(ep: Endpoint) -> tuple[int, int, str]:
            return self.load[ep.name], ep.metrics.running_requests_size, ep.name

        if prefer:
            holding = [
                ep
                for ep in self.replicas
                if under_cap(ep)
                and self.load[ep.name] < self.fair_share
                and matches[ep.name] >= self.min_blocks
            ]
            if holding:
                return min(holding, key=lambda ep: (-matches[ep.name], *least(ep)))
        return min([ep for ep in self.replicas if under_cap(ep)] or self.replicas, key=least)
