"""`epick serve` settles the garbage collector once started: what start-up built is frozen, and
young collections run every 50,000 allocations."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from epick.service.run import GC_THRESHOLDS, settle_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_start_up_objects_are_frozen_and_thresholds_raised() -> None:
    gc.unfreeze()
    settle_gc()
    assert gc.get_freeze_count() > 1000  # the modules and objects imported so far
    assert gc.get_threshold() == GC_THRESHOLDS == (50_000, 20, 100)
    assert gc.get_count()[0] < 100  # a full collection ran first: nothing young is left to freeze
