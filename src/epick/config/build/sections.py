"""The config's sections around its plugins: feature gates, sections epick does not use, and the
references of `schedulingProfiles` (checked before anything is built)."""

from __future__ import annotations

from epick.config.build.plugins import PluginBuilder
from epick.config.schema import IGNORED_SECTIONS, EndpointPickerConfigFile, split_feature_gate
from epick.config.suggest import did_you_mean
from epick.config.upstream import feature_gate, retired_feature_gate, upstream_type

FLOW_CONTROL_GATE = "flowControl"


def ignored_section_warnings(b: PluginBuilder) -> None:
    """Sections of the Go format epick accepts and does not act on."""
    for section, why in IGNORED_SECTIONS.items():
        if getattr(b.doc, section) is not None:
            key = EndpointPickerConfigFile.model_fields[section].alias or section
            b.warnings.append(f"section '{key}' is accepted but not used: {why}")


def feature_gate_warnings(b: PluginBuilder) -> None:
    """Schema validation let only upstream's gates through, current or retired."""
    for entry in b.doc.feature_gates:
        name, _ = split_feature_gate(entry)
        retired = retired_feature_gate(name)
        if retired is not None:
            b.warnings.append(
                f"feature gate {entry!r} has no effect: it {retired.did}; upstream removed it in "
                f"{retired.removed_in} ({retired.change}), and epick {retired.in_epick}"
            )
            continue
        gate = feature_gate(name)
        assert gate is not None
        if name == FLOW_CONTROL_GATE:
            continue  # acted on: see flow_control.py
        default = "on" if gate.enabled_by_default else "off"
        b.warnings.append(
            f"feature gate {entry!r} is accepted but not used: epick does not act on it "
            f"(upstream, {name} enables {gate.enables}; {default} by default)"
        )


def check_profile_refs(b: PluginBuilder) -> None:
    seen: dict[str, int] = {}
    for i, profile in enumerate(b.doc.scheduling_profiles):
        path = f"schedulingProfiles[{i}]"
        if not profile.name:
            b.fail(f"{path}.name", "profile has an empty name", "give the profile a name")
        elif profile.name in seen:
            first = seen[profile.name]
            b.fail(
                f"{path}.name",
                f"duplicate profile name {profile.name!r} (schedulingProfiles[{first}] has it too)",
                "give each profile a distinct name",
            )
        else:
            seen[profile.name] = i
        refs: set[str] = set()
        for j, ref in enumerate(profile.plugins):
            rpath = f"{path}.plugins[{j}]"
            if ref.plugin_ref not in b.entries:
                close = did_you_mean(ref.plugin_ref, b.entries)
                fix = f"did you mean '{close}'?" if close else "define it under 'plugins' first"
                b.fail(f"{rpath}.pluginRef", f"refers to undefined plugin {ref.plugin_ref!r}", fix)
            elif ref.plugin_ref in refs:
                b.fail(
                    f"{rpath}.pluginRef",
                    f"plugin {ref.plugin_ref!r} is referenced twice in this profile",
                    "reference each plugin once per profile",
                )
            refs.add(ref.plugin_ref)
            if ref.weight is not None and not (ref.weight >= 0 and ref.weight != float("inf")):
                b.fail(
                    f"{rpath}.weight",
                    f"weight {ref.weight} is not a finite number >= 0",
                    "use a weight >= 0",
                )


def flow_control_enabled(b: PluginBuilder) -> bool:
    enabled = False
    for entry in b.doc.feature_gates:
        name, value = split_feature_gate(entry)
        if name == FLOW_CONTROL_GATE:
            enabled = value
    return enabled


def refuse_experimental(b: PluginBuilder) -> None:
    """As the Go EPP without `--allow-experimental-plugins`: a plugin of a type upstream registers as
    Alpha is refused (the first by name, as upstream checks them in name order)."""
    for name in sorted(b.entries):
        index, entry = b.entries[name]
        found = upstream_type(entry.type)
        if found is not None and found.stability == "alpha":
            b.fail(
                f"plugins[{index}].type",
                f"plugin '{name}' (type: '{entry.type}') has Alpha stability level, but command line flag "
                "--allow-experimental-plugins is not set",
                "pass --allow-experimental-plugins, or remove the plugin",
            )
            return
