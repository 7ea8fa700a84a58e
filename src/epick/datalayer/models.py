"""Which models the endpoints serve: each endpoint's /v1/models, polled in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp

from epick.datalayer.datastore import Datastore

log = logging.getLogger(__name__)


class ModelCatalog:
    def __init__(self, datastore: Datastore, *, interval: float = 5.0, timeout: float = 1.0) -> None:
        self.datastore = datastore
        self.interval = interval
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.by_endpoint: dict[str, list[dict[str, Any]]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        # `known()` runs for every request: its answer is kept until the polls or the set of
        # healthy endpoints change (both are replaced, never mutated, so identity tells).
        self._known: set[str] = set()
        self._known_for: tuple[object, object] | None = None

    def known(self) -> set[str]:
        """Model ids served by at least one healthy endpoint (empty until the first poll answers)."""
        key = (self.by_endpoint, self.datastore.snapshot())
        if self._known_for is None or key[0] is not self._known_for[0] or key[1] is not self._known_for[1]:
            self._known = {
                card["id"]
                for name, cards in self.by_endpoint.items()
                if self.datastore.is_healthy(name)
                for card in cards
                if isinstance(card.get("id"), str)
            }
            self._known_for = key
        return self._known

    def cards(self) -> list[dict[str, Any]]:
        """The union of the endpoints' model cards, one per id."""
        seen: dict[str, dict[str, Any]] = {}
        for name, cards in self.by_endpoint.items():
            if self.datastore.is_healthy(name):
                for card in cards:
                    seen.setdefault(str(card.get("id")), card)
        return list(seen.values())

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="model catalog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    async def refresh(self) -> None:
        specs = self.datastore.specs()
        results = await asyncio.gather(*(self._fetch(s.host_port) for s in specs), return_exceptions=True)
        fresh: dict[str, list[dict[str, Any]]] = {}
        for spec, result in zip(specs, results, strict=True):
            if isinstance(result, list):
                fresh[spec.name] = result
            elif spec.name in self.by_endpoint:
                fresh[spec.name] = self.by_endpoint[spec.name]  # keep the last answer through a blip
        self.by_endpoint = fresh

    async def _fetch(self, host_port: str) -> list[dict[str, Any]]:
        assert self._session is not None
        async with self._session.get(f"http://{host_port}/v1/models", timeout=self.timeout) as r:
            if r.status != 200:
                raise aiohttp.ClientResponseError(r.request_info, (), status=r.status)
            body = await r.json(content_type=None)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ValueError(f"{host_port}/v1/models has no 'data' list")
        return [card for card in data if isinstance(card, dict)]

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh()
            except Exception:  # a poll must never end the loop
                log.exception("model catalog refresh failed")
