"""What the engines hold of a prompt, for the oracle policy (`ServerView.cached_tokens`), and the
LoRA adapters' ids, given on first sight."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from epick.sim.engine.kv_cache import chain_hashes
from epick.simulate.types import BASE_MODEL, SimRequestSpec

if TYPE_CHECKING:
    from epick.simulate.fleet import Fleet


def block_hashes(fleet: Fleet, spec: SimRequestSpec) -> list[int]:
    """The block-hash chain of a prompt (its adapter's: a LoRA request's blocks are its own),
    computed once per request for every server's lookup."""
    if spec is not fleet._hashed:
        tokens = spec.tokens
        bs = fleet.engines[0].config.block_size
        # As far as an engine looks up: the last token is always computed.
        blocks = (len(tokens) - 1) // bs
        hashes = chain_hashes(
            tokens, 0, blocks, block_size=bs, parent=None, lora_id=adapter_id(fleet, spec.model)
        )
        fleet._hashed, fleet._hashes = spec, hashes
    return fleet._hashes


def cached_tokens_fn(fleet: Fleet, i: int) -> Callable[[SimRequestSpec], int]:
    engine = fleet.engines[i]
    bs = engine.config.block_size

    def cached(spec: SimRequestSpec) -> int:
        engine.sync(fleet._now)
        lookup = engine.pool.cached
        n = 0
        for h in block_hashes(fleet, spec):
            if h not in lookup:
                break
            n += bs
        return n

    return cached


def adapter_id(fleet: Fleet, model: str) -> int | None:
    """The adapter id of a model (None for the base model), given on first sight; the first
    adapter turns on the engines' LoRA reports and a fresh scrape."""
    if model == BASE_MODEL:
        return None
    lora_id = fleet.lora_ids.get(model)
    if lora_id is None:
        lora_id = fleet.lora_ids[model] = len(fleet.lora_ids) + 1
        if not fleet.engines[0].track_loras:
            track_loras(fleet, True)
            fleet._scraped_epoch = -1  # the views' LoRA fields are stale: scrape again
    return lora_id


def track_loras(fleet: Fleet, on: bool) -> None:
    """Engines report their LoRA sets (costly) only in a fleet whose requests name adapters."""
    on = on and fleet.engines[0].config.max_loras > 0
    for e in fleet.engines:
        e.track_loras = on
