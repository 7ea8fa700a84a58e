"""Scheduling failures. Each names the profile and, where one is at fault, the plugin."""

from __future__ import annotations


class SchedulingError(Exception):
    """A scheduling call could not produce a result."""

    def __init__(self, message: str, *, profile: str | None = None, plugin: str | None = None) -> None:
        super().__init__(message)
        self.profile = profile
        self.plugin = plugin


class NoEndpointsError(SchedulingError):
    """There was no candidate endpoint at all (the service answers 503)."""


class EndpointsFilteredError(SchedulingError):
    """Filters removed every candidate (the service answers 429)."""
