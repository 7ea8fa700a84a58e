"""The request-body bytes held at once, over every connection of a front end.

Each body is bounded (`--max-body-bytes`); this bounds their sum, so that many large bodies arriving
together cannot take the process's memory with them: past the budget a body is refused (503, try
again) instead of read.
"""

from __future__ import annotations

__all__ = ["BodiesHeldError", "BodyBudget"]


class BodiesHeldError(Exception):
    """The bodies held at once would pass the budget."""


class BodyBudget:
    """Bytes taken by the bodies being held, at most `limit` (None: no limit)."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        """Hold `size` more bytes, if the budget allows."""
        if self.limit is not None and self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size
