"""Load an `EndpointPickerConfig` into a ready scheduler and request-control hooks.

Two phases, as the Go EPP's loader: (1) parse, default and validate the document; (2) build the
plugins and assemble profiles and handler. Every problem of a phase is collected before failing, each
naming its path in the file and a fix; nothing half-built is ever returned. The result is a
`LoadedConfig` (`epick.config.loaded`); `epick.config.issues` words the validation errors.

A plugin type epick lacks but the upstream EPP registers (`epick.config.upstream`) is reported as
such, with its upstream origin; a did-you-mean never names a plugin of the opposite meaning
(`epick.config.suggest`).
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from epick.config.datalayer import DataLayerBuilder
from epick.config.defaults import (
    DEFAULT_CONFIG_YAML,
    DEFAULT_HANDLER,
    DEFAULT_PARSERS,
    DEFAULT_PICKER,
    DEFAULT_PROFILE,
)
from epick.config.entrypoints import default_registry
from epick.config.errors import ConfigError, ConfigIssue
from epick.config.issues import _issue_from_pydantic, _params_hint
from epick.config.loaded import LoadedConfig, RequestHooks
from epick.config.schema import (
    IGNORED_SECTIONS,
    EndpointPickerConfigFile,
    FlowControlSection,
    PluginEntry,
    PluginRef,
    PriorityBandSection,
    ProfileEntry,
    split_feature_gate,
)
from epick.config.suggest import did_you_mean
from epick.config.upstream import (
    EQUIVALENT_FIXES,
    UPSTREAM_TYPES,
    feature_gate,
    retired_feature_gate,
    upstream_type,
)
from epick.flowcontrol import BandSettings, FlowControlSettings
from epick.flowcontrol.settings import (
    DEFAULT_BAND_MAX_BYTES,
    DEFAULT_BAND_MAX_REQUESTS,
    DEFAULT_REQUEST_TTL,
)
from epick.framework import (
    Filter,
    Parser,
    ParserSet,
    Picker,
    Plugin,
    ProfileHandler,
    SaturationDetector,
    Scheduler,
    SchedulerProfile,
    Scorer,
    WeightedScorer,
)
from epick.framework.flowcontrol import (
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    UsageLimitPolicy,
)
from epick.plugins.filters.utilization import UtilizationDetector, UtilizationParameters
from epick.plugins.parsers import PARSER_TYPES
from epick.plugins.prerequest.prefill_header import PrefillHeaderHandler
from epick.plugins.profile.disagg import DisaggProfileHandler
from epick.plugins.profile.requirements import NeedsProfiles
from epick.plugins.registry import ParameterError, Registry

FLOW_CONTROL_GATE = "flowControl"
# Upstream's default policies, resolved by name (llm-d/llm-d-router, pkg/epp/flowcontrol/registry/config.go).
DEFAULT_ORDERING_POLICY = "fcfs-ordering-policy"
DEFAULT_FAIRNESS_POLICY = "global-strict-fairness-policy"
DEFAULT_USAGE_LIMIT_POLICY = "static-usage-limit-policy"
# In-flight eviction's victim filter and order (upstream's cmd/epp/runner/runner.go buildRequestEvictor).
EVICTION_FILTER = "sheddable-eviction-filter"
EVICTION_ORDERING = "priority-then-time-eviction-order-policy"


def load_config(
    path: str | Path | None,
    *,
    seed: int | None = None,
    registry: Registry | None = None,
    previous: LoadedConfig | None = None,
) -> LoadedConfig:
    """The config file at `path`, or the built-in default config when `path` is None.

    With `previous` (the running config, on a reload), a plugin whose name, type and parameters did
    not change, and that uses no other plugin, is the running instance itself: it keeps its state
    (the prefix index, requests in flight, an LRU order).
    """
    if path is None:
        return load_default_config(registry=registry, seed=seed, previous=previous)
    return load_config_file(path, registry=registry, seed=seed, previous=previous)


def load_config_file(
    path: str | Path,
    *,
    registry: Registry | None = None,
    seed: int | None = None,
    previous: LoadedConfig | None = None,
) -> LoadedConfig:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(source, [ConfigIssue("", f"cannot read the file: {e.strerror or e}")]) from None
    except UnicodeDecodeError:
        raise ConfigError(source, [ConfigIssue("", "the file is not UTF-8 text")]) from None
    return load_config_text(text, source=source, registry=registry, seed=seed, previous=previous)


def load_default_config(
    *, registry: Registry | None = None, seed: int | None = None, previous: LoadedConfig | None = None
) -> LoadedConfig:
    return load_config_text(
        DEFAULT_CONFIG_YAML, source="<default config>", registry=registry, seed=seed, previous=previous
    )


def load_config_text(
    text: str,
    *,
    source: str = "<config>",
    registry: Registry | None = None,
    seed: int | None = None,
    previous: LoadedConfig | None = None,
) -> LoadedConfig:
    load_failures: list[str] = []
    if registry is None:
        registry, load_failures = default_registry()
    document = _parse(text, source)
    builder = _Builder(source, document, registry, seed, load_failures, previous=previous)
    return builder.build()


def _parse(text: str, source: str) -> EndpointPickerConfigFile:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(
            source, [ConfigIssue("", f"not valid YAML: {where}{problem}", "correct the YAML syntax there")]
        ) from None
    if raw is None:
        raise ConfigError(
            source,
            [
                ConfigIssue(
                    "", "the file is empty", "write an EndpointPickerConfig, or give no config file at all"
                )
            ],
        )
    if not isinstance(raw, dict):
        raise ConfigError(
            source,
            [
                ConfigIssue(
                    "",
                    f"expected a mapping at the top, found {type(raw).__name__}",
                    "start with 'apiVersion:'",
                )
            ],
        )
    try:
        return EndpointPickerConfigFile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(
            source, [_issue_from_pydantic(err, EndpointPickerConfigFile) for err in e.errors()]
        ) from None


class _DependencyFailedError(Exception):
    pass


class _Handle:
    def __init__(self, builder: _Builder, requester: str) -> None:
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
            raise _DependencyFailedError(name)
        self._builder.uses.setdefault(self._requester, set()).add(name)
        return plugin

    def rng(self, name: str) -> random.Random:
        seed = self._builder.seed
        return random.Random(f"{seed}/{name}") if seed is not None else random.Random()


class _Builder:
    def __init__(
        self,
        source: str,
        doc: EndpointPickerConfigFile,
        registry: Registry,
        seed: int | None,
        load_failures: list[str],
        *,
        previous: LoadedConfig | None = None,
    ) -> None:
        self.source = source
        self.previous = previous
        self.fingerprints: dict[str, str] = {}  # plugin name -> its type and parameters, as built
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
        if self.issues:
            raise ConfigError(self.source, self.issues)

    # Phase 1: names, types, references, defaults.
    def build(self) -> LoadedConfig:
        self._index_plugins()
        self._add_required_producers()
        self._check_profiles_refs()
        for section, why in IGNORED_SECTIONS.items():
            if getattr(self.doc, section) is not None:
                key = EndpointPickerConfigFile.model_fields[section].alias or section
                self.warnings.append(f"section '{key}' is accepted but not used: {why}")
        self._feature_gate_warnings()
        # Phase 2: build every plugin (also when phase 1 found problems, to report all at once),
        # then assemble.
        for name in self.entries:
            self.instantiate(name)
        self.check()
        profiles, handler = self._assemble()
        detector = self._saturation_detector()
        flow_control = self._flow_control()
        parsers = self._parsers()
        data_layer = DataLayerBuilder(
            self.doc, self.instances, self.fail, self.warnings.append, self._default_instance
        ).build()
        self.check()
        assert handler is not None
        scheduler = Scheduler(profiles, handler)
        plugins = list(self.instances.values())
        return LoadedConfig(
            source=self.source,
            scheduler=scheduler,
            plugins=dict(self.instances),
            hooks=RequestHooks.from_plugins(plugins),
            saturation_detector=detector,
            flow_control=flow_control,
            parsers=parsers,
            data_layer=data_layer,
            warnings=self.warnings,
            fingerprints=dict(self.fingerprints),
            uses={name: frozenset(used) for name, used in self.uses.items()},
        )

    def _index_plugins(self) -> None:
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

    def _add_required_producers(self) -> None:
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

    def _feature_gate_warnings(self) -> None:
        """Schema validation let only upstream's gates through, current or retired."""
        for entry in self.doc.feature_gates:
            name, _ = split_feature_gate(entry)
            retired = retired_feature_gate(name)
            if retired is not None:
                self.warnings.append(
                    f"feature gate {entry!r} has no effect: it {retired.did}; upstream removed it in "
                    f"{retired.removed_in} ({retired.change}), and epick {retired.in_epick}"
                )
                continue
            gate = feature_gate(name)
            assert gate is not None
            if name == FLOW_CONTROL_GATE:
                continue  # acted on: see _flow_control
            default = "on" if gate.enabled_by_default else "off"
            self.warnings.append(
                f"feature gate {entry!r} is accepted but not used: epick does not act on it "
                f"(upstream, {name} enables {gate.enables}; {default} by default)"
            )

    def _check_profiles_refs(self) -> None:
        seen: dict[str, int] = {}
        for i, profile in enumerate(self.doc.scheduling_profiles):
            path = f"schedulingProfiles[{i}]"
            if not profile.name:
                self.fail(f"{path}.name", "profile has an empty name", "give the profile a name")
            elif profile.name in seen:
                first = seen[profile.name]
                self.fail(
                    f"{path}.name",
                    f"duplicate profile name {profile.name!r} (schedulingProfiles[{first}] has it too)",
                    "give each profile a distinct name",
                )
            else:
                seen[profile.name] = i
            refs: set[str] = set()
            for j, ref in enumerate(profile.plugins):
                rpath = f"{path}.plugins[{j}]"
                if ref.plugin_ref not in self.entries:
                    close = did_you_mean(ref.plugin_ref, self.entries)
                    fix = f"did you mean '{close}'?" if close else "define it under 'plugins' first"
                    self.fail(f"{rpath}.pluginRef", f"refers to undefined plugin {ref.plugin_ref!r}", fix)
                elif ref.plugin_ref in refs:
                    self.fail(
                        f"{rpath}.pluginRef",
                        f"plugin {ref.plugin_ref!r} is referenced twice in this profile",
                        "reference each plugin once per profile",
                    )
                refs.add(ref.plugin_ref)
                if ref.weight is not None and not (ref.weight >= 0 and ref.weight != float("inf")):
                    self.fail(
                        f"{rpath}.weight",
                        f"weight {ref.weight} is not a finite number >= 0",
                        "use a weight >= 0",
                    )

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
            params = spec.parameters.model_validate(entry.parameters or {})
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
        kept = self._running(name, fingerprint)
        if kept is not None:
            self.instances[name] = kept
            return kept
        self._building.append(name)
        try:
            plugin = spec.factory(name, params, _Handle(self, name))
        except _DependencyFailedError as e:
            if e.args[0] == name:  # a plugin naming itself: the cycle is already reported
                self._failed.add(name)
                return None
            self.fail(
                f"{path}.parameters",
                f"depends on plugin {e.args[0]!r}, which could not be built",
                "fix that plugin",
            )
            self._failed.add(name)
            return None
        except ParameterError as e:
            self.fail(
                f"{path}.parameters.{e.parameter}", f"{entry.type}: {e}", e.fix or "correct the parameter"
            )
            self._failed.add(name)
            return None
        except (ValueError, TypeError) as e:
            self.fail(f"{path}.parameters", f"{entry.type}: {e}", "correct the parameters")
            self._failed.add(name)
            return None
        finally:
            self._building.pop()
        self.instances[name] = plugin
        return plugin

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

    def _assemble(self) -> tuple[dict[str, SchedulerProfile], ProfileHandler | None]:
        handlers = [(n, p) for n, p in self.instances.items() if isinstance(p, ProfileHandler)]
        if len(handlers) > 1:
            names = ", ".join(repr(n) for n, _ in handlers)
            self.fail(
                "plugins", f"more than one profile handler: {names}", "keep exactly one profile handler"
            )
        entries = list(self.doc.scheduling_profiles)
        if not entries:
            # The Go EPP's default: one profile holding every filter, scorer and picker.
            refs = [
                PluginRef(pluginRef=n)
                for n, p in self.instances.items()
                if isinstance(p, Filter | Scorer | Picker)
            ]
            entries = [ProfileEntry(name=DEFAULT_PROFILE, plugins=refs)]
        default_picker = next((p for p in self.instances.values() if isinstance(p, Picker)), None)
        profiles: dict[str, SchedulerProfile] = {}
        for i, entry in enumerate(entries):
            profile = self._profile(i, entry, default_picker)
            if profile is not None:
                profiles[profile.name] = profile
        handler = handlers[0][1] if handlers else None
        if handler is None:
            if len(entries) == 1:
                handler = self._default_handler()
            else:
                self.fail(
                    "plugins",
                    f"no profile handler configured for {len(entries)} profiles",
                    "add a plugin of type disagg-profile-handler or shadow-profile-handler "
                    "(single-profile-handler runs only one profile)",
                )
        elif handler.typed_name.type == DEFAULT_HANDLER and len(entries) > 1:
            index = self.entries[handler.typed_name.name][0]
            self.fail(
                f"plugins[{index}].type",
                f"single-profile-handler cannot run {len(entries)} profiles",
                "keep one profile, or use disagg-profile-handler or shadow-profile-handler",
            )
        profile_names = {e.name for e in entries}
        extra_handlers = {n for n, _ in handlers[1:]}  # reported above
        for plugin_name, plugin in self.instances.items():
            if not isinstance(plugin, NeedsProfiles) or plugin_name in extra_handlers:
                continue
            index = self.entries[plugin_name][0] if plugin_name in self.entries else -1
            for key, profile_name in plugin.required_profiles().items():
                if profile_name not in profile_names:
                    self.fail(
                        f"plugins[{index}].parameters.{key}",
                        f"profile {profile_name!r} does not exist",
                        f"name one of the profiles: {', '.join(sorted(profile_names))}",
                    )
        self._check_prefill_header(handler)
        return profiles, handler

    def _check_prefill_header(self, handler: ProfileHandler | None) -> None:
        """A prefill-header-handler names the profile whose target prefills (`x-prefiller-host-port`);
        the P/D profile handler runs that profile, so both must name the same one."""
        if not isinstance(handler, DisaggProfileHandler):
            return
        for plugin_name, plugin in self.instances.items():
            if isinstance(plugin, PrefillHeaderHandler) and plugin.prefill_profile != handler.prefill_profile:
                index = self.entries[plugin_name][0] if plugin_name in self.entries else -1
                self.fail(
                    f"plugins[{index}].parameters.prefillProfile",
                    f"names profile {plugin.prefill_profile!r}, but the profile handler "
                    f"{handler.typed_name.name!r} prefills with profile {handler.prefill_profile!r}",
                    f"name {handler.prefill_profile!r} here, or make it the handler's prefill profile",
                )

    def _default_handler(self) -> ProfileHandler:
        spec = self.registry.get(DEFAULT_HANDLER)
        assert spec is not None
        plugin = spec.factory(DEFAULT_HANDLER, spec.parameters(), _Handle(self, DEFAULT_HANDLER))
        assert isinstance(plugin, ProfileHandler)
        self.instances.setdefault(DEFAULT_HANDLER, plugin)
        return plugin

    def _default_picker(self) -> Picker:
        existing = self.instances.get(DEFAULT_PICKER)
        if isinstance(existing, Picker):
            return existing
        spec = self.registry.get(DEFAULT_PICKER)
        assert spec is not None
        plugin = spec.factory(DEFAULT_PICKER, spec.parameters(), _Handle(self, DEFAULT_PICKER))
        assert isinstance(plugin, Picker)
        self.instances.setdefault(DEFAULT_PICKER, plugin)
        return plugin

    def _profile(self, i: int, entry: ProfileEntry, default_picker: Picker | None) -> SchedulerProfile | None:
        path = f"schedulingProfiles[{i}]"
        filters: list[Filter] = []
        scorers: list[WeightedScorer] = []
        picker: Picker | None = None
        ok = True
        for j, ref in enumerate(entry.plugins):
            rpath = f"{path}.plugins[{j}]"
            plugin = self.instances.get(ref.plugin_ref)
            if plugin is None:
                ok = False  # already reported
                continue
            described = f"plugin {ref.plugin_ref!r} ({plugin.typed_name.type})"
            if isinstance(plugin, ProfileHandler):
                self.fail(
                    f"{rpath}.pluginRef",
                    f"{described} is a profile handler; it cannot be part of a profile",
                    "remove this reference: the handler is used from the plugins list",
                )
                ok = False
                continue
            used = False
            if isinstance(plugin, Filter):
                filters.append(plugin)
                used = True
            if isinstance(plugin, Scorer):
                scorers.append(WeightedScorer(plugin, 1.0 if ref.weight is None else ref.weight))
                used = True
            elif ref.weight is not None:
                self.fail(
                    f"{rpath}.weight",
                    f"{described} is not a scorer; only scorers take a weight",
                    "remove 'weight'",
                )
                ok = False
            if isinstance(plugin, Picker):
                if picker is not None:
                    self.fail(
                        f"{rpath}.pluginRef",
                        f"{described} is a second picker in this profile (already {picker.typed_name})",
                        "keep one picker per profile",
                    )
                    ok = False
                picker = plugin
                used = True
            if not used:
                # Upstream's profile ignores such a plugin (GIE v1.5's integration configs list their
                # parser and reporter in the profile); it still works from the plugins list.
                self.warnings.append(
                    f"{rpath}: {described} is not a filter, scorer or picker; the profile ignores it "
                    "(it works from the plugins list)"
                )
        if picker is None:
            picker = default_picker if default_picker is not None else self._default_picker()
        if not ok or picker is None:
            return None
        return SchedulerProfile(entry.name, picker, filters, scorers)

    def _parsers(self) -> ParserSet:
        """The parsers `requestHandler.parsers` lists (or GIE's one `parser`, or upstream's default list),
        as upstream's loader finds them: a reference to no plugin of the config that names a parser
        type makes a default instance of that type, named after it."""
        section, single = self.doc.request_handler, self.doc.parser
        refs: list[tuple[str, str]]
        if section is not None and section.parsers:
            refs = [
                (f"requestHandler.parsers[{i}].pluginRef", r.plugin_ref)
                for i, r in enumerate(section.parsers)
            ]
            if single is not None:
                self.warnings.append(
                    "'parser' is deprecated upstream and ignored here: 'requestHandler.parsers' is given"
                )
        elif single is not None:
            refs = [("parser.pluginRef", single.plugin_ref)]
        else:
            refs = [("requestHandler.parsers", ref) for ref in DEFAULT_PARSERS]
        parsers: list[Parser] = []
        for path, ref in refs:
            plugin = self.instances.get(ref)
            if plugin is None and ref not in self.entries:
                plugin = self._default_parser(path, ref)
            if plugin is None:
                continue
            if not isinstance(plugin, Parser):
                self.fail(
                    path,
                    f"plugin {ref!r} ({plugin.typed_name.type}) is not a parser",
                    f"refer to a parser plugin: {', '.join(self._parser_types())}",
                )
                continue
            parsers.append(plugin)
        found = ParserSet(parsers)
        for parser, why in found.skipped:
            self.warnings.append(f"parser {parser.typed_name.name!r} is not used: {why}")
        return found

    def _default_parser(self, path: str, ref: str) -> Plugin | None:
        spec = self.registry.get(ref)
        if spec is None:
            close = did_you_mean(ref, [*self.entries, *PARSER_TYPES])
            fix = f"did you mean '{close}'?" if close else f"name a parser type ({', '.join(PARSER_TYPES)})"
            self.fail(path, f"refers to undefined plugin {ref!r}", fix + " or define it under 'plugins'")
            return None
        try:
            plugin = spec.factory(ref, spec.parameters(), _Handle(self, ref))
        except (ValueError, TypeError, LookupError, _DependencyFailedError) as e:
            self.fail(path, f"cannot make a default {ref!r}: {e}", f"define {ref!r} under 'plugins'")
            return None
        return plugin  # not among the config's plugins: it is the parser list's own

    def _default_instance(self, type_name: str) -> Plugin | None:
        """A plugin of `type_name` with default parameters, named after its type (an injected default)."""
        spec = self.registry.get(type_name)
        if spec is None:
            return None
        params = spec.parameters()
        fingerprint = json.dumps([spec.type, params.model_dump(mode="json")], sort_keys=True, default=str)
        self.fingerprints[type_name] = fingerprint
        return self._running(type_name, fingerprint) or spec.factory(
            type_name, params, _Handle(self, type_name)
        )

    def _parser_types(self) -> list[str]:
        return [t for t in PARSER_TYPES if t in self.registry]

    def _flow_control_enabled(self) -> bool:
        enabled = False
        for entry in self.doc.feature_gates:
            name, value = split_feature_gate(entry)
            if name == FLOW_CONTROL_GATE:
                enabled = value
        return enabled

    def _flow_control(self) -> FlowControlSettings | None:
        """The flow-control layer's settings when the `flowControl` gate is on (None: off)."""
        section = self.doc.flow_control
        if not self._flow_control_enabled():
            if section is not None:
                self.warnings.append(
                    "section 'flowControl' is ignored but for its saturationDetector: the 'flowControl' "
                    "feature gate is off (add it to featureGates to queue requests instead of shedding them)"
                )
            return None
        section = section or FlowControlSection()
        ordering = self._ordering(DEFAULT_ORDERING_POLICY, "flowControl", default=True)
        fairness = self._fairness(DEFAULT_FAIRNESS_POLICY, "flowControl", default=True)
        ref = section.usage_limit_policy_plugin_ref
        usage_limit = self._usage_limit(
            ref or DEFAULT_USAGE_LIMIT_POLICY, "flowControl.usageLimitPolicyPluginRef", default=not ref
        )
        if ordering is None or fairness is None:
            return None
        defaults = BandSettings(0, ordering, fairness)

        def band(entry: PriorityBandSection, path: str, priority: int) -> BandSettings | None:
            b_ordering: OrderingPolicy | None = ordering
            b_fairness: FairnessPolicy | None = fairness
            if entry.ordering_policy_ref:
                b_ordering = self._ordering(entry.ordering_policy_ref, f"{path}.orderingPolicyRef")
            if entry.fairness_policy_ref:
                b_fairness = self._fairness(entry.fairness_policy_ref, f"{path}.fairnessPolicyRef")
            limits = {}
            for key, value in (("maxBytes", entry.max_bytes), ("maxRequests", entry.max_requests)):
                if value is not None and value < 0:
                    self.fail(f"{path}.{key}", f"must be non-negative, got {value}", "use 0 for the default")
                limits[key] = max(value or 0, 0)
            if b_ordering is None or b_fairness is None:
                return None
            return BandSettings(
                priority,
                b_ordering,
                b_fairness,
                max_bytes=limits["maxBytes"] or DEFAULT_BAND_MAX_BYTES,
                max_requests=limits["maxRequests"] or DEFAULT_BAND_MAX_REQUESTS,
            )

        default_band = defaults
        if section.default_priority_band is not None:
            default_band = (
                band(section.default_priority_band, "flowControl.defaultPriorityBand", 0) or defaults
            )
        negative = None
        if section.default_negative_priority_band is not None:
            negative = band(
                section.default_negative_priority_band, "flowControl.defaultNegativePriorityBand", -1
            )
        bands: dict[int, BandSettings] = {}
        for i, entry in enumerate(section.priority_bands):
            path = f"flowControl.priorityBands[{i}]"
            if entry.priority in bands:
                self.fail(
                    f"{path}.priority",
                    f"duplicate priority level {entry.priority}",
                    "configure each priority once",
                )
                continue
            built = band(entry, path, entry.priority)
            if built is not None:
                bands[entry.priority] = built
        if 0 not in bands:  # the fallback band always exists, from the default template
            bands[0] = replace(default_band, priority=0)
        for key, value in (("maxBytes", section.max_bytes), ("maxRequests", section.max_requests)):
            if value is not None and value < 0:
                self.fail(
                    f"flowControl.{key}", f"must be non-negative, got {value}", "use 0 for no global limit"
                )
        eviction_filter, eviction_ordering = (
            self._eviction_policies() if section.enable_eviction else (None, None)
        )
        if usage_limit is None:
            return None  # reported; the bands were still checked
        ttl = section.default_request_ttl
        no_endpoint_ttl = section.no_endpoint_request_ttl
        if no_endpoint_ttl is None:
            no_endpoint_ttl = ttl  # follows defaultRequestTTL unless split on purpose
        return FlowControlSettings(
            bands=bands,
            default_band=default_band,
            usage_limit=usage_limit,
            default_negative_band=negative,
            max_bytes=max(section.max_bytes or 0, 0),
            max_requests=max(section.max_requests or 0, 0),
            default_request_ttl=DEFAULT_REQUEST_TTL if ttl is None else ttl,
            no_endpoint_request_ttl=DEFAULT_REQUEST_TTL if no_endpoint_ttl is None else no_endpoint_ttl,
            enable_eviction=section.enable_eviction,
            eviction_filter=eviction_filter,
            eviction_ordering=eviction_ordering,
        )

    def _eviction_policies(self) -> tuple[EvictionFilterPolicy | None, EvictionOrderingPolicy | None]:
        """In-flight eviction's victim filter and order: upstream wires these two, whatever the
        config defines."""
        found_filter = self._default_instance(EVICTION_FILTER)
        found_ordering = self._default_instance(EVICTION_ORDERING)
        if isinstance(found_filter, EvictionFilterPolicy) and isinstance(
            found_ordering, EvictionOrderingPolicy
        ):
            return found_filter, found_ordering
        self.fail(
            "flowControl.enableEviction",
            f"in-flight eviction needs the {EVICTION_FILTER} and {EVICTION_ORDERING} plugin types, "
            "which this registry lacks",
        )
        return None, None

    def _flow_ref(self, ref: str, path: str, default: bool) -> Plugin | None:
        """The plugin `ref` names; a default reference (upstream's default policies, by type name)
        the config does not define is made with default parameters."""
        found = self.instances.get(ref)
        if found is None and default and ref not in self.entries:
            found = self._default_instance(ref)
        if found is None and ref not in self.entries:  # (one that failed to build has its own error)
            close = did_you_mean(ref, self.entries)
            self.fail(
                path,
                f"refers to undefined plugin {ref!r}",
                f"did you mean '{close}'?" if close else f"define a plugin named {ref!r} under 'plugins'",
            )
        return found

    def _wrong_kind(self, path: str, ref: str, plugin: Plugin, kind: str) -> None:
        self.fail(
            path,
            f"plugin {ref!r} ({plugin.typed_name.type}) is not a flow-control {kind}",
            f"refer to a {kind} plugin",
        )

    def _ordering(self, ref: str, path: str, *, default: bool = False) -> OrderingPolicy | None:
        found = self._flow_ref(ref, path, default)
        if found is None or isinstance(found, OrderingPolicy):
            return found
        self._wrong_kind(path, ref, found, "ordering policy")
        return None

    def _fairness(self, ref: str, path: str, *, default: bool = False) -> FairnessPolicy | None:
        found = self._flow_ref(ref, path, default)
        if found is None or isinstance(found, FairnessPolicy):
            return found
        self._wrong_kind(path, ref, found, "fairness policy")
        return None

    def _usage_limit(self, ref: str, path: str, *, default: bool = False) -> UsageLimitPolicy | None:
        found = self._flow_ref(ref, path, default)
        if found is None or isinstance(found, UsageLimitPolicy):
            return found
        self._wrong_kind(path, ref, found, "usage-limit policy")
        return None

    def _saturation_detector(self) -> SaturationDetector:
        section = self.doc.saturation_detector
        path = "saturationDetector"
        if self.doc.flow_control is not None and self.doc.flow_control.saturation_detector is not None:
            if section is not None:
                self.warnings.append(
                    "'saturationDetector' is deprecated upstream and overridden by "
                    "'flowControl.saturationDetector', which is used"
                )
            section = self.doc.flow_control.saturation_detector
            path = "flowControl.saturationDetector"
        detectors = [(n, p) for n, p in self.instances.items() if isinstance(p, UtilizationDetector)]
        if section is not None and section.plugin_ref is not None:
            if section.queue_depth_threshold is not None or section.kv_cache_util_threshold is not None:
                self.fail(
                    path,
                    "give either 'pluginRef' or thresholds, not both",
                    "move the thresholds into the referenced plugin's parameters",
                )
            found = self.instances.get(section.plugin_ref)
            if not isinstance(found, SaturationDetector):
                self.fail(
                    f"{path}.pluginRef",
                    f"{section.plugin_ref!r} is not a saturation detector plugin of this config",
                    "define a utilization-detector or concurrency-detector plugin and refer to its name",
                )
                return UtilizationDetector()
            return found
        if section is not None:
            values: dict[str, Any] = {
                "queueDepthThreshold": section.queue_depth_threshold,
                "kvCacheUtilThreshold": section.kv_cache_util_threshold,
                "metricsStalenessThreshold": section.metrics_staleness_threshold,
            }
            try:
                given = {k: v for k, v in values.items() if v is not None}
                params = UtilizationParameters.model_validate(given)
            except ValidationError as e:
                for err in e.errors():
                    issue = _issue_from_pydantic(err, UtilizationParameters, prefix=path)
                    self.issues.append(issue)
                return UtilizationDetector()
            return UtilizationDetector("saturation-detector", params)
        if detectors:
            return detectors[0][1]
        return UtilizationDetector("saturation-detector")
