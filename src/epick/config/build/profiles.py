"""Assembling the scheduling profiles and the profile handler from the built plugins.

Defaults as the Go EPP's: a profile without a picker gets the first picker the config defines, else
a `max-score-picker`; one profile and no handler gets a `single-profile-handler`; no profiles at all
make one `default` profile of every filter, scorer and picker. A handler or hook that names profiles
must name profiles that exist, and the plugins bound to the profile that prefills must agree on it.
"""

from __future__ import annotations

from epick.config.build.plugins import Handle, PluginBuilder
from epick.config.defaults import DEFAULT_HANDLER, DEFAULT_PICKER, DEFAULT_PROFILE
from epick.config.schema import PluginRef, ProfileEntry
from epick.framework import (
    Filter,
    NeedsProfiles,
    Picker,
    PrefillProfileBound,
    ProfileHandler,
    SchedulerProfile,
    Scorer,
    WeightedScorer,
)


def assemble(b: PluginBuilder) -> tuple[dict[str, SchedulerProfile], ProfileHandler | None]:
    handlers = [(n, p) for n, p in b.instances.items() if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        names = ", ".join(repr(n) for n, _ in handlers)
        b.fail("plugins", f"more than one profile handler: {names}", "keep exactly one profile handler")
    entries = list(b.doc.scheduling_profiles)
    if not entries:
        # The Go EPP's default: one profile holding every filter, scorer and picker.
        refs = [
            PluginRef(pluginRef=n) for n, p in b.instances.items() if isinstance(p, Filter | Scorer | Picker)
        ]
        entries = [ProfileEntry(name=DEFAULT_PROFILE, plugins=refs)]
    default_picker = next((p for p in b.instances.values() if isinstance(p, Picker)), None)
    profiles: dict[str, SchedulerProfile] = {}
    for i, entry in enumerate(entries):
        profile = _profile(b, i, entry, default_picker)
        if profile is not None:
            profiles[profile.name] = profile
    handler = handlers[0][1] if handlers else None
    if handler is None:
        if len(entries) == 1:
            handler = _default_handler(b)
        else:
            b.fail(
                "plugins",
                f"no profile handler configured for {len(entries)} profiles",
                "add a plugin of type disagg-profile-handler or shadow-profile-handler "
                "(single-profile-handler runs only one profile)",
            )
    elif handler.typed_name.type == DEFAULT_HANDLER and len(entries) > 1:
        index = b.index(handler.typed_name.name)
        b.fail(
            f"plugins[{index}].type",
            f"single-profile-handler cannot run {len(entries)} profiles",
            "keep one profile, or use disagg-profile-handler or shadow-profile-handler",
        )
    profile_names = {e.name for e in entries}
    extra_handlers = {n for n, _ in handlers[1:]}  # reported above
    for plugin_name, plugin in b.instances.items():
        if not isinstance(plugin, NeedsProfiles) or plugin_name in extra_handlers:
            continue
        index = b.index(plugin_name)
        for key, profile_name in plugin.required_profiles().items():
            if profile_name not in profile_names:
                b.fail(
                    f"plugins[{index}].parameters.{key}",
                    f"profile {profile_name!r} does not exist",
                    f"name one of the profiles: {', '.join(sorted(profile_names))}",
                )
    _check_prefill_profiles(b, handler)
    return profiles, handler


def _check_prefill_profiles(b: PluginBuilder, handler: ProfileHandler | None) -> None:
    """The profile handler that runs a prefill profile, and the hooks that act on its target (the
    prefill-header-handler's `x-prefiller-host-port`), must name the same profile."""
    if not isinstance(handler, PrefillProfileBound):
        return
    wanted = handler.bound_prefill_profile()
    for plugin_name, plugin in b.instances.items():
        if plugin is handler or not isinstance(plugin, PrefillProfileBound):
            continue
        named = plugin.bound_prefill_profile()
        if named != wanted:
            b.fail(
                f"plugins[{b.index(plugin_name)}].parameters.prefillProfile",
                f"names profile {named!r}, but the profile handler "
                f"{handler.typed_name.name!r} prefills with profile {wanted!r}",
                f"name {wanted!r} here, or make it the handler's prefill profile",
            )


def _default_handler(b: PluginBuilder) -> ProfileHandler:
    spec = b.registry.get(DEFAULT_HANDLER)
    assert spec is not None
    plugin = spec.factory(DEFAULT_HANDLER, spec.parameters(), Handle(b, DEFAULT_HANDLER))
    assert isinstance(plugin, ProfileHandler)
    b.instances.setdefault(DEFAULT_HANDLER, plugin)
    return plugin


def _default_picker(b: PluginBuilder) -> Picker:
    existing = b.instances.get(DEFAULT_PICKER)
    if isinstance(existing, Picker):
        return existing
    spec = b.registry.get(DEFAULT_PICKER)
    assert spec is not None
    plugin = spec.factory(DEFAULT_PICKER, spec.parameters(), Handle(b, DEFAULT_PICKER))
    assert isinstance(plugin, Picker)
    b.instances.setdefault(DEFAULT_PICKER, plugin)
    return plugin


def _profile(
    b: PluginBuilder, i: int, entry: ProfileEntry, default_picker: Picker | None
) -> SchedulerProfile | None:
    path = f"schedulingProfiles[{i}]"
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    picker: Picker | None = None
    ok = True
    for j, ref in enumerate(entry.plugins):
        rpath = f"{path}.plugins[{j}]"
        plugin = b.instances.get(ref.plugin_ref)
        if plugin is None:
            ok = False  # already reported
            continue
        described = f"plugin {ref.plugin_ref!r} ({plugin.typed_name.type})"
        if isinstance(plugin, ProfileHandler):
            b.fail(
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
            b.fail(
                f"{rpath}.weight",
                f"{described} is not a scorer; only scorers take a weight",
                "remove 'weight'",
            )
            ok = False
        if isinstance(plugin, Picker):
            if picker is not None:
                b.fail(
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
            b.warnings.append(
                f"{rpath}: {described} is not a filter, scorer or picker; the profile ignores it "
                "(it works from the plugins list)"
            )
    if picker is None:
        picker = default_picker if default_picker is not None else _default_picker(b)
    if not ok or picker is None:
        return None
    return SchedulerProfile(entry.name, picker, filters, scorers)
