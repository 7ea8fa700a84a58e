"""The parsers a config uses: `requestHandler.parsers`, GIE's single `parser`, or upstream's list."""

from __future__ import annotations

from epick.config.build.plugins import DependencyFailedError, Handle, PluginBuilder
from epick.config.defaults import DEFAULT_PARSERS, PARSER_TYPES
from epick.config.suggest import did_you_mean
from epick.framework import Parser, ParserSet, Plugin


def build_parsers(b: PluginBuilder) -> ParserSet:
    """The parsers `requestHandler.parsers` lists (or GIE's one `parser`, or upstream's default list),
    as upstream's loader finds them: a reference to no plugin of the config that names a parser
    type makes a default instance of that type, named after it."""
    section, single = b.doc.request_handler, b.doc.parser
    refs: list[tuple[str, str]]
    if section is not None and section.parsers:
        refs = [
            (f"requestHandler.parsers[{i}].pluginRef", r.plugin_ref) for i, r in enumerate(section.parsers)
        ]
        if single is not None:
            b.warnings.append(
                "'parser' is deprecated upstream and ignored here: 'requestHandler.parsers' is given"
            )
    elif single is not None:
        refs = [("parser.pluginRef", single.plugin_ref)]
    else:
        refs = [("requestHandler.parsers", ref) for ref in DEFAULT_PARSERS]
    parsers: list[Parser] = []
    for path, ref in refs:
        plugin = b.instances.get(ref)
        if plugin is None and ref not in b.entries:
            plugin = _default_parser(b, path, ref)
        if plugin is None:
            continue
        if not isinstance(plugin, Parser):
            b.fail(
                path,
                f"plugin {ref!r} ({plugin.typed_name.type}) is not a parser",
                f"refer to a parser plugin: {', '.join(_parser_types(b))}",
            )
            continue
        parsers.append(plugin)
    found = ParserSet(parsers)
    for parser, why in found.skipped:
        b.warnings.append(f"parser {parser.typed_name.name!r} is not used: {why}")
    return found


def _default_parser(b: PluginBuilder, path: str, ref: str) -> Plugin | None:
    spec = b.registry.get(ref)
    if spec is None:
        close = did_you_mean(ref, [*b.entries, *PARSER_TYPES])
        fix = f"did you mean '{close}'?" if close else f"name a parser type ({', '.join(PARSER_TYPES)})"
        b.fail(path, f"refers to undefined plugin {ref!r}", fix + " or define it under 'plugins'")
        return None
    try:
        plugin = spec.factory(ref, spec.parameters(), Handle(b, ref))
    except (ValueError, TypeError, LookupError, DependencyFailedError) as e:
        b.fail(path, f"cannot make a default {ref!r}: {e}", f"define {ref!r} under 'plugins'")
        return None
    return plugin  # not among the config's plugins: it is the parser list's own


def _parser_types(b: PluginBuilder) -> list[str]:
    return [t for t in PARSER_TYPES if t in b.registry]
