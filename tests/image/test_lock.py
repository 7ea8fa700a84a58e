"""image/requirements.txt, the image's pins (scripts/lock-image writes it), agrees with pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of every pin in the lock."""
    text = (ROOT / "image" / "requirements.txt").read_text()
    pins: dict[str, tuple[str, list[str]]] = {}
    for entry in re.split(
        r"\n(?=[A-Za-z])", "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    ):
        if not entry.strip():
            continue
        head, *rest = entry.split("\\\n")
        name, version = head.strip().split("==")
        pins[_normal(name)] = (version, [h.strip().removeprefix("--hash=") for h in rest])
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_runtime_dependency_is_locked_at_pyprojects_version_with_one_hash() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locked()
    for text in project["dependencies"]:
        req = Requirement(text)
        assert _normal(req.name) in pins, (
            f"{req.name} is not in image/requirements.txt: run scripts/lock-image"
        )
        version, hashes = pins[_normal(req.name)]
        assert req.specifier.contains(version), (
            f"{req.name}: locked {version}, pyproject asks {req.specifier}"
        )
        assert len(hashes) == 1 and re.fullmatch(r"sha256:[0-9a-f]{64}", hashes[0]), (req.name, hashes)
    assert all(len(hashes) == 1 for _, hashes in pins.values())


def test_the_image_leaves_out_what_only_plots_benchmarks_and_the_gbdt_learner_need() -> None:
    pins = locked()
    for left_out in ("matplotlib", "scipy", "lightgbm", "pillow", "fonttools", "pytest", "mypy"):
        assert left_out not in pins, left_out
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["gbdt"] == ["lightgbm==4.7.0"] and extras["plots"] == ["matplotlib==3.11.2"]
