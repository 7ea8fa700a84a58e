"""The candidates of a scheduling call, with the version of the data layer they were taken from."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from epick.framework.endpoint import Endpoint


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Endpoints with their metrics at one moment, and that moment's version. Two snapshots with the
    same version hold the same endpoint objects with the same metrics; the data layer gives a new
    version whenever an endpoint comes, goes, changes or is scraped. A scheduling call given a plain
    sequence instead has no version, and reuses nothing between calls."""

    endpoints: tuple[Endpoint, ...]
    version: int

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(self.endpoints)

    def __len__(self) -> int:
        return len(self.endpoints)

    def __getitem__(self, i: int) -> Endpoint:
        return self.endpoints[i]
