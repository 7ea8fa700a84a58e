"""What the plugins' `dump_state` (`/debug/plugins/state`) share: long lists are cut, as upstream's
dumps cut them, at `MAX_LISTED`, with the full length given beside."""

from __future__ import annotations

from collections.abc import Iterable

MAX_LISTED = 100


def capped(names: Iterable[str], limit: int = MAX_LISTED) -> list[str]:
    """The first `limit` of `names`, sorted."""
    return sorted(names)[:limit]
