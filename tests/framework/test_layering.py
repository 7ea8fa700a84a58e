"""The framework stays pure: no HTTP, Kubernetes or asyncio, and nothing imports upward."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "epick"
LAYERS = ["framework", "plugins", "config", "datalayer", "requestcontrol", "extproc", "proxy", "cli"]
FORBIDDEN_IN_FRAMEWORK = {
    "asyncio",
    "aiohttp",
    "httpx",
    "grpc",
    "kubernetes",
    "kubernetes_asyncio",
    "http",
    "urllib",
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((SRC / "framework").rglob("*.py")), ids=lambda p: p.name)
def test_framework_has_no_io_imports(path: Path) -> None:
    bad = {m for m in imports(path) if m.split(".")[0] in FORBIDDEN_IN_FRAMEWORK}
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if (SRC / layer).is_dir()])
def test_nothing_imports_upward(layer: str) -> None:
    above = set(LAYERS[LAYERS.index(layer) + 1 :])
    for path in (SRC / layer).rglob("*.py"):
        for module in imports(path):
            parts = module.split(".")
            if parts[0] == "epick" and len(parts) > 1:
                assert parts[1] not in above, f"{path.relative_to(SRC)} imports {module} (a higher layer)"
