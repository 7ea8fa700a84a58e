"""The framework stays pure: no HTTP, Kubernetes or asyncio, and nothing imports upward; the simulated
server stands alone, and the fleet simulator uses the router only through its public API."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "epick"
LAYERS = [
    "framework",
    "tokenization",
    "kvcache",
    "plugins",
    "flowcontrol",
    "config",
    "datalayer",
    "requestcontrol",
    "wire",
    "extproc",
    "proxy",
    "service",
    "cli",
]
FORBIDDEN_IN_FRAMEWORK = {
    "asyncio",
    "aiohttp",
    "httpx",
    "grpc",
    "kubernetes",
    "kubernetes_asyncio",
    "http",
    "urllib",
    "zmq",
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize(
    "path",
    sorted(
        p
        for layer in ("framework", "flowcontrol", "tokenization", "kvcache")
        for p in (SRC / layer).rglob("*.py")
    ),
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_framework_has_no_io_imports(path: Path) -> None:
    """The framework, the flow controller (which the fleet simulator runs in virtual time), and the
    tokenizers and KV-block index (pure: the data layer feeds them)."""
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


def epick_imports(path: Path) -> set[str]:
    return {m for m in imports(path) if m == "epick" or m.startswith("epick.")}


@pytest.mark.parametrize("path", sorted((SRC / "sim").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_the_simulated_server_stands_alone(path: Path) -> None:
    """A vLLM-compatible server: it knows nothing of the router it is measured with. It shares only the
    pure libraries of vLLM's formats: tokenization, and vLLM's block hashes and KV events."""
    shared = ("epick.sim", "epick.tokenization", "epick.kvcache")
    bad = {m for m in epick_imports(path) if not any(m == a or m.startswith(a + ".") for a in shared)}
    assert not bad, f"{path.relative_to(SRC)} imports {bad}"


# The router's public API, as the fleet simulator may use it: the framework's types, configs, the
# request lifecycle that every front end runs (director, cycle, path), and the flow controller.
PUBLIC_API = {
    "epick.framework",
    "epick.config",
    "epick.flowcontrol",
    "epick.requestcontrol.path",
    "epick.requestcontrol.director",
    "epick.requestcontrol.cycle",
    "epick.requestcontrol.errors",
    "epick.kvcache",
}


@pytest.mark.parametrize(
    "path", sorted((SRC / "simulate").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC))
)
def test_the_fleet_simulator_uses_only_the_routers_public_api(path: Path) -> None:
    allowed = ("epick.sim", "epick.simulate")
    bad = {
        m
        for m in epick_imports(path)
        if m not in PUBLIC_API and not any(m == a or m.startswith(a + ".") for a in allowed)
    }
    assert not bad, f"{path.relative_to(SRC)} imports {bad}"


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "cli"])
def test_the_router_does_not_import_the_simulators(layer: str) -> None:
    for path in (SRC / layer).rglob("*.py"):
        for module in epick_imports(path):
            assert module.split(".")[1:2] not in (["sim"], ["simulate"]), (
                f"{path.relative_to(SRC)} imports {module}"
            )


# Below the composition root (epick.service) only the plugin registry names concrete plugins; the
# other layers use the framework's interfaces (protocols such as CoreMetricsReader, ExportsMetrics,
# EndpointsFileDiscovery, PrefillProfileBound).
REGISTRY = {"epick.plugins", "epick.plugins.registry", "epick.plugins.duration"}


def test_below_the_service_only_the_registry_names_concrete_plugins() -> None:
    found: dict[str, set[str]] = {}
    for layer in LAYERS[LAYERS.index("flowcontrol") : LAYERS.index("service")]:
        for path in sorted((SRC / layer).rglob("*.py")):
            named = {m for m in epick_imports(path) if m.startswith("epick.plugins") and m not in REGISTRY}
            if named:
                found[str(path.relative_to(SRC))] = named
    assert found == {}
