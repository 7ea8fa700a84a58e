"""The policies `epick simulate` compares: epick configs (shipped, or files) and the baselines."""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

from epick.config import load_config, load_config_file, load_config_text
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.types import Policy

# Policies that are epick configs (the same files ship under config/; a test keeps them equal).
CONFIG_POLICIES = {
    "round-robin": """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: round-robin-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: round-robin-picker
""",
    "random": """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
""",
    "load-only": """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: max-score-picker
""",
    # llm-d's precise prefix-cache routing (llm-d/llm-d-router deploy/config/epp-precise-prefix-cache-
    # config.yaml): the index fed by the simulated engines' KV events, weights 2/1/1.
    "precise-prefix": """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig:
      blockSize: 64
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 2.0
  - pluginRef: kv-cache-utilization-scorer
    weight: 1.0
  - pluginRef: queue-scorer
    weight: 1.0
  - pluginRef: max-score-picker
""",
}
PolicyFactory = Callable[[int], Policy]


class UsageError(Exception):
    """A bad command line that argparse cannot see by itself; exit status 2."""


def policy_factories(args: argparse.Namespace) -> list[tuple[str, PolicyFactory]]:
    """(name, factory(seed)) for every --policy and --config, in the order given. A config's name is
    its file name without extension; when two would share a name, the later one is named by its path
    (without extension), and by a #2, #3… suffix after that."""
    from epick.simulate.policies import POLICIES

    out: list[tuple[str, PolicyFactory]] = []
    taken: set[str] = set()
    for kind, value in args.policies:
        if kind == "policy":
            name = value
            if name == "default":
                factory = _file_policy(None, name)
            elif name in CONFIG_POLICIES:
                factory = _config_policy(name, CONFIG_POLICIES[name])
            elif name in POLICIES:
                factory = _baseline_policy(POLICIES[name])
            else:
                raise UsageError(f"unknown --policy {name!r}; choose from {', '.join(policy_names())}")
        else:
            load_config_file(value)  # fail early, with the file's errors
            path = Path(value)
            name = path.stem
            if name in taken:
                name = str(path.with_suffix(""))
            factory = _file_policy(value, name)
        unique, k = name, 1
        while unique in taken:
            k += 1
            unique = f"{name}#{k}"
        taken.add(unique)
        out.append((unique, factory))
    if not out:
        raise UsageError("give at least one --policy or --config")
    return out


def policy_names() -> list[str]:
    from epick.simulate.policies import POLICIES

    return ["default", *CONFIG_POLICIES, *POLICIES]


def _config_policy(name: str, text: str) -> PolicyFactory:
    def build(seed: int) -> Policy:
        return EpickPolicy(name, load_config_text(text, source=name, seed=seed))

    return build


def _file_policy(path: str | None, name: str) -> PolicyFactory:
    """The config file at `path`, or the default config when `path` is None."""

    def build(seed: int) -> Policy:
        return EpickPolicy(name, load_config(path, seed=seed))

    return build


def _baseline_policy(factory: Callable[[random.Random], Policy]) -> PolicyFactory:
    def build(seed: int) -> Policy:
        return factory(random.Random(seed))

    return build
