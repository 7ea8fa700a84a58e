"""An optional capability of profile handlers: naming the profiles they need."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class NeedsProfiles(Protocol):
    def required_profiles(self) -> dict[str, str]:
        """Profile names this handler refers to, keyed by the parameter that names them."""
        ...
