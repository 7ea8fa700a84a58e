"""Every Helm values file of llm-d's guides and llm-d-router's charts, read as the chart reads it:
each EndpointPickerConfig it embeds (`router.epp.pluginsCustomConfig`, a ConfigMap's data) loads
and schedules, and each EPP flag it sets (`router.epp.flags`) is one `epp` takes.

tests/config/upstream-values/ holds them unchanged under a `# Source:` line naming repository,
revision and path: llm-d/llm-d at 48fa8c0 (guides/), versions newer than it read from the code
search store (llm-d-guides-store/, each marked so), and llm-d-router at ebab687 (config/charts/*/
values.yaml; llm-d-router's deploy/ holds configs, not values, and those are in upstream/).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from epick.cli.epp_flags import FLAGS
from epick.cli.explain import explain
from epick.cli.goflags import parse_go_flags
from epick.config import load_config_text
from tests.config.test_upstream_corpus import _pool, _request

VALUES = sorted((Path(__file__).parent / "upstream-values").glob("*/*.yaml"))
# Values files that embed no config: they layer flags, images or monitoring over a guide's own.
NO_CONFIG = {
    "llm-d-guides/modelexpress-p2p-router-modelexpress-p2p.values.yaml",
    "llm-d-guides/recipes-router-base.values.yaml",
    "llm-d-guides/recipes-router-features-agentgateway-proxy.values.yaml",
    "llm-d-guides/recipes-router-features-monitoring.values.yaml",
    "llm-d-guides/recipes-router-features-tracing.values.yaml",
    "llm-d-guides/wide-ep-lws-router-xpu.values.yaml",
    "llm-d-router/llm-d-router-gateway-values.yaml",
    "llm-d-router/llm-d-router-standalone-values.yaml",
    "llm-d-router/routerlib-values.yaml",
}


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def embedded(document: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(key path, text) of every string in the document that is an EndpointPickerConfig."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from embedded(value, f"{where}.{key}" if where else str(key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            yield from embedded(value, f"{where}[{i}]")
    elif isinstance(document, str) and "kind: EndpointPickerConfig" in document:
        yield where, document


def documents(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def epp_flags(document: Any) -> dict[str, Any]:
    router = document.get("router") if isinstance(document, dict) else None
    epp = router.get("epp") if isinstance(router, dict) else None
    flags = epp.get("flags") if isinstance(epp, dict) else None
    return flags if isinstance(flags, dict) else {}


@pytest.mark.parametrize("path", VALUES, ids=_name)
def test_every_config_a_values_file_embeds_loads_and_schedules(path: Path) -> None:
    assert path.read_text(encoding="utf-8").startswith("# Source: "), "each values file names its source"
    configs = [found for d in documents(path) for found in embedded(d)]
    assert (not configs) == (_name(path) in NO_CONFIG), configs
    for where, text in configs:
        config = load_config_text(text, source=f"{path}:{where}", seed=0)
        explanation = explain(config, _request(), _pool())
        assert explanation.result is not None, f"{where}: {explanation.trace.error}"
        assert explanation.result.targets


@pytest.mark.parametrize("path", VALUES, ids=_name)
def test_the_epp_flags_a_values_file_sets_are_flags_epp_takes(path: Path) -> None:
    for document in documents(path):
        # The chart renders each entry as --name=value (a key may carry "=value" itself).
        args = [
            f"--{k}" if "=" in str(k) else f"--{k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in epp_flags(document).items()
        ]
        parse_go_flags(args, FLAGS)  # raises FlagError naming an unknown flag or a bad value


def test_the_corpus_has_the_guides_values() -> None:
    assert len(VALUES) >= 40
    assert sum(1 for p in VALUES if _name(p) not in NO_CONFIG) >= 30
