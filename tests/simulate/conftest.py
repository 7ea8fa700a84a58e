"""The markers of the simulator's tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ray: starts a local Ray instance (2 CPUs; skipped where Ray is not installed)"
    )
