"""Building a config's plugins: each entry of `plugins` by its type's spec, on demand.

Entries are indexed first (names, types; an upstream type epick lacks is named as such), then the
data producers a plugin reads are added when the config has none (upstream's default producers),
then each plugin is built from its validated parameters. A factory may ask the handle for another
plugin (built first; a cycle is an error). On a reload, a plugin whose type and parameters did not
change, and whose lookups find the same plugins, is the running instance itself (it keeps its state).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from epick.config.errors import ConfigError, ConfigIssue
from epick.config.issues import _issue_from_pydantic, _params_hint
from epick.config.loaded import LoadedConfig
from epick.config.schema import EndpointPickerConfigFile, PluginEntry
from epick.config.suggest import did_you_mean
from epick.config.upstream import EQUIVALENT_FIXES, UPSTREAM_TYPES, upstream_type
from epick.framework import Clock, Plugin
from epick.plugins.registry import DEFAULT_STALENESS, ParameterError, Parameters, PluginSpec, Registry

DEFAULT_PLUGIN_STATE_STALENESS = DEFAULT_STALENESS


class DependencyFailedError(Exception):
    """A plugin asked for another that could not be built."""


class Handle:
    """What a factory gets: the other plugins of its config, and a seeded random source."""

    def __init__(self, builder: PluginBuilder, requester: str) -> None:
        self._builder = builder
        self._requester = requester

    def plugin(self, name: str) -> Plugin:
        # Recorded even when the lookup fails: a plugin that looked for another and went without is
        # rebuilt on a reload that adds it.
        self._builder.uses.setdefault(self._requester, set()).add(name)
        if name not in self._builder.entries:
            known = list(self._builder.entries)
            close = did_you_mean(name, known)
            hint = f"did you mean '{close}'?" if close else f"name one of: {', '.join(known) or 'none'}"
            raise LookupError(name, hint)
        plugin = self._builder.instantiate(name)
        if plugin is None:
            raise DependencyFailedError(name)
        self._builder.uses.setdefault(self._requester, set()).add(name)
        return plugin

    def rng(self, name: str) -> random.Random:
        seed = self._builder.seed
        return random.Random(f"{seed}/{name}") if seed is not None else random.Random()

    @property
    def clock(self) -> Clock:
        return self._builder.clock

    @property
    def workers(self) -> int:
        return self._builder.workers

    @property
    def plugin_state_staleness(self) -> float:
        return self._builder.plugin_state_staleness


class PluginBuilder:
    """The plugins of one config document, built by name on demand (a factory may ask for another),
    every problem recorded as a `ConfigIssue` with its path in the file."""

    def __init__(
        self,
        source: str,
        doc: EndpointPickerConfigFile,
        registry: Registry,
        seed: int | None,
        load_failures: list[str],
        *,
        previous: LoadedConfig | None = None,
        clock: Clock | None = None,
        workers: int = 1,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        plugin_state_staleness: float = DEFAULT_PLUGIN_STATE_STALENESS,
    ) -> None:
        """`overrides`: parameters, by plugin type, that replace what the file gives every plugin of
        that type (a command-line setting such as the metrics staleness threshold)."""
        self.source = source
        self.previous = previous
        self.clock = clock or Clock()
        self.workers = workers
        self.plugin_state_staleness = plugin_state_staleness
        self.overrides = overrides or {}
        self.fingerprints: dict[str, str] = {}  # plugin name -> its type and parameters, as built
        self.worker_states: dict[str, str] = {}  # plugin name -> what it keeps per worker (declared)
        self.uses: dict[str, set[str]] = {}  # plugin name -> the plugins its factory asked for
        self.doc = doc
        self.registry = registry
        self.seed = seed
        self.load_failures = load_failures
        self.issues: list[ConfigIssue] = []
        self.warnings: list[str] = list(load_failures)
        self.entries: dict[str, tuple[int, PluginEntry]] = {}
        self.instances: dict[str, Plugin] = {}
        self._failed: set[str] = set()
        self._building: list[str] = []

    def fail(self, path: str, message: str, fix: str = "") -> None:
        self.issues.append(ConfigIssue(path, message, fix))

    def check(self) -> None:
        """Raise `ConfigError` with every issue found so far, if any."""
        if self.issues:
            raise ConfigError(self.source, self.issues)

    def _declare(self, name: str, spec: PluginSpec, params: Parameters) -> None:
        state = spec.worker_state_of(params)
        if state is not None:
            self.worker_states[name] = state

    def parameters_of(self, type_name: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """A plugin's parameters: what the file gives, under the overrides for its type."""
        return {**given, **self.overrides.get(type_name, {})}

    def index(self, name: str) -> int:
        """The position of plugin `name` in the file's `plugins` (-1: added by the loader)."""
        return self.entries[name][0] if name in self.entries else -1

    def index_plugins(self) -> None:
        for i, entry in enumerate(self.doc.plugins):
            path = f"plugins[{i}]"
            name = entry.name or entry.type
            if not entry.type:
                self.fail(
                    f"{path}.type", "plugin has an empty type", "set 'type' to a registered plugin type"
                )
                continue
            if name in self.entries:
                first = self.entries[name][0]
                self.fail(
                    f"{path}.name",
                    f"duplicate plugin name {name!r} (plugins[{first}] has it too)",
                    "give each instance a distinct 'name'",
                )
                continue
            if entry.type not in self.registry:
                message, fix = self._unknown_type(entry.type)
                if self.load_failures:
                    fix += "; note: " + "; ".join(self.load_failures)
                self.fail(f"{path}.type", message, fix)
                self._failed.add(name)
            else:
                upstream = upstream_type(entry.type)
                if upstream is not None and upstream.deprecated:
                    self.warnings.append(
                        f"{path}.type: {entry.type!r} is deprecated upstream since {upstream.deprecated_in} "
                        f"(removal planned in {upstream.removal_in or 'a later release'}); "
                        f"its replacement is {upstream.replacement!r}"
                    )
            self.entries[name] = (i, entry)

    def add_required_producers(self) -> None:
        """Upstream's default producers: a plugin that reads a producer's data the config does not
        define gets one, named after its type, with default parameters (transitively)."""
        pending = list(self.entries)
        while pending:
            name = pending.pop(0)
            _, entry = self.entries[name]
            spec = self.registry.get(entry.type)
            if spec is None or spec.requires is None:
                continue
            try:
                params = spec.parameters.model_validate(entry.parameters or {})
            except ValidationError:
                continue  # reported when the plugin is built
            for needed in spec.requires(params, self.doc.api_version):
                if needed in self.entries or needed not in self.registry:
                    continue
                self.entries[needed] = (-1, PluginEntry(type=needed))
                self.warnings.append(
                    f"plugin {needed!r} added with default parameters: {name!r} reads its data"
                )
                pending.append(needed)

    def _unknown_type(self, type_name: str) -> tuple[str, str]:
        """The error and fix for a type epick's registry lacks: an upstream type epick does not
        implement yet, or an unknown one with the closest registered type."""
        upstream = upstream_type(type_name)
        if upstream is not None:
            notes = [upstream.origin]
            if upstream.deprecated:
                since, replacement = upstream.deprecated_in, upstream.replacement
                notes.append(f"deprecated upstream since {since}, replaced by {replacement!r}")
            if upstream.test_only:
                notes.append("registered upstream for its conformance tests only")
            message = (
                f"plugin type {type_name!r} is an upstream EPP {upstream.kind} ({'; '.join(notes)}) "
                "that epick does not implement yet"
            )
            if upstream.replacement and upstream.replacement in self.registry:
                fix = f"use {upstream.replacement!r}, its upstream replacement, which epick has"
            else:
                fix = EQUIVALENT_FIXES.get(type_name, "see docs/plugins.md for the upstream types epick has")
            return message, fix
        types = self.registry.types()
        close = did_you_mean(type_name, types)
        if close is not None:
            fix = f"did you mean '{close}'?"
        else:
            lacking = [t.name for t in UPSTREAM_TYPES if t.name not in self.registry]
            near = did_you_mean(type_name, lacking)
            near_type = upstream_type(near) if near is not None else None
            if near_type is not None:
                fix = (
                    f"the closest name is {near_type.name!r}, an upstream EPP {near_type.kind} that epick "
                    "does not implement yet; use a registered type"
                )
            else:
                fix = "use a registered type"
        fix += f" (run 'epick plugins' to list them; {len(types)} are registered)"
        return f"unknown plugin type {type_name!r}", fix

    def instantiate(self, name: str) -> Plugin | None:
        if name in self.instances:
            return self.instances[name]
        if name in self._failed:
            return None
        index, entry = self.entries[name]
        path = f"plugins[{index}]"
        if name in self._building:
            cycle = " -> ".join([*self._building[self._building.index(name) :], name])
            self.fail(
                f"{path}.parameters", f"plugins refer to each other in a cycle: {cycle}", "break the cycle"
            )
            self._failed.add(name)
            return None
        spec = self.registry.get(entry.type)
        assert spec is not None
        try:
            params = spec.parameters.model_validate(self.parameters_of(spec.type, entry.parameters or {}))
        except ValidationError as e:
            for err in e.errors():
                issue = _issue_from_pydantic(err, spec.parameters, prefix=f"{path}.parameters")
                self.issues.append(
                    ConfigIssue(
                        issue.path,
                        f"{entry.type}: {issue.message}",
                        issue.fix + ("" if "allowed here" in issue.fix else _params_hint(spec.parameters)),
                    )
                )
            self._failed.add(name)
            return None
        fingerprint = json.dumps([spec.type, params.model_dump(mode="json")], sort_keys=True, default=str)
        self.fingerprints[name] = fingerprint
        self._declare(name, spec, params)
        kept = self._running(name, fingerprint)
        if kept is not None:
            self.instances[name] = kept
            return kept
        self._building.append(name)
        try:
            plugin = self._call_factory(name, path, entry.type, spec, params)
        finally:
            self._building.pop()
        if plugin is None:
            self._failed.add(name)
            return None
        self.instances[name] = plugin
        return plugin

    def _call_factory(
        self, name: str, path: str, type_name: str, spec: PluginSpec, params: Parameters
    ) -> Plugin | None:
        """The factory's plugin, or None with its complaint reported at `path` (under the type name
        the file gave)."""
        try:
            return spec.factory(name, params, Handle(self, name))
        except DependencyFailedError as e:
            if e.args[0] != name:  # a plugin naming itself: the cycle is already reported
                self.fail(
                    f"{path}.parameters",
                    f"depends on plugin {e.args[0]!r}, which could not be built",
                    "fix that plugin",
                )
        except ParameterError as e:
            self.fail(
                f"{path}.parameters.{e.parameter}", f"{type_name}: {e}", e.fix or "correct the parameter"
            )
        except (ValueError, TypeError) as e:
            self.fail(f"{path}.parameters", f"{type_name}: {e}", "correct the parameters")
        return None

    def _running(self, name: str, fingerprint: str) -> Plugin | None:
        """The running config's instance of `name`, when it can be kept: same type and parameters, and
        every plugin it looked up when built is the same now (itself kept, or still absent), since a
        kept instance would not see their changes."""
        previous = self.previous
        if previous is None or previous.fingerprints.get(name) != fingerprint:
            return None
        used = previous.uses.get(name, frozenset())
        for dependency in used:
            if dependency not in self.entries:
                if dependency in previous.plugins:
                    return None  # it went away
                continue  # absent then, absent now
            if dependency not in previous.plugins:
                return None  # it is new: the plugin must be built to find it
            if self.instantiate(dependency) is not previous.plugins[dependency]:
                return None
        if used:
            self.uses[name] = set(used)
        return previous.plugins.get(name)

    def default_instance(self, type_name: str) -> Plugin | None:
        """A plugin of `type_name` with default parameters, named after its type (an injected default)."""
        spec = self.registry.get(type_name)
        if spec is None:
            return None
        try:
            params = spec.parameters.model_validate(self.parameters_of(spec.type, {}))
        except ValidationError as e:  # an override the type's parameters refuse
            prefix = f"{type_name} (added by the loader).parameters"
            self.issues.extend(
                _issue_from_pydantic(err, spec.parameters, prefix=prefix) for err in e.errors()
            )
            return None
        fingerprint = json.dumps([spec.type, params.model_dump(mode="json")], sort_keys=True, default=str)
        self.fingerprints[type_name] = fingerprint
        self._declare(type_name, spec, params)
        return self._running(type_name, fingerprint) or spec.factory(
            type_name, params, Handle(self, type_name)
        )
