"""Plugin types by config name: what each needs to be built, and the registry that holds them."""

from __future__ import annotations

import builtins
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from epick.framework import Clock, Plugin

P = TypeVar("P", bound=Plugin)
# Plugin state's staleness by default: upstream's fwkplugin default
# (pkg/epp/framework/interface/plugin/plugin_state.go), five minutes.
DEFAULT_STALENESS = 300.0


class Parameters(BaseModel):
    """Base of every plugin's parameters: camelCase in YAML, unknown keys rejected, frozen."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class NoParameters(Parameters):
    pass


class Handle(Protocol):
    """What a factory may ask of the config being built."""

    def plugin(self, name: str) -> Plugin:
        """The plugin instance called `name` in the same config (built first if need be).

        Raises LookupError(name, hint) when the config has no plugin of that name.
        """
        ...

    def rng(self, name: str) -> random.Random:
        """A random source for plugin `name`, seeded from the config's seed when one is set."""
        ...

    @property
    def clock(self) -> Clock:
        """The config's clock, for a plugin that keeps time (virtual time in the fleet simulator)."""
        ...

    @property
    def workers(self) -> int:
        """How many worker processes decide with copies of this config (`epick serve --workers`): a
        plugin that picks at random between equals picks alike in every copy when above 1."""
        ...

    @property
    def plugin_state_staleness(self) -> float:
        """Seconds without a sign of life after which a request's plugin state (its in-flight
        accounting) is taken as gone and reaped (`epp --plugin-state-staleness-threshold`)."""
        ...


Factory = Callable[[str, Any, Handle], Plugin]


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """How to build one plugin type: its parameters model and a factory taking validated parameters.

    `aliases` are other names a config may use for the same type (an upstream renamed it, or two
    upstreams name it differently); a plugin built under an alias reports its `type`.
    """

    type: str
    factory: Factory
    parameters: builtins.type[Parameters] = NoParameters
    summary: str = ""
    aliases: tuple[str, ...] = ()
    # The data producers (by type) a plugin built with these parameters reads, given the config's
    # apiVersion (GIE's and llm-d's loaders differ): when the config has no plugin of that name, the
    # loader adds one with default parameters (upstream's default producers).
    requires: Callable[[Any, str], tuple[str, ...]] | None = None
    # What a plugin built from this spec remembers of earlier requests that `epick serve`'s workers
    # do not share, in words ("" for nothing: no state, a random draw, a turn aside), or a function
    # of its parameters saying so. None: not declared (a `Replicated` plugin shares its state; one
    # that reads `Reads.HISTORY` and declares nothing is taken to keep some).
    worker_state: str | Callable[[Any], str] | None = None

    def worker_state_of(self, params: Any) -> str | None:
        """What a plugin built with `params` keeps per worker (None: not declared)."""
        state = self.worker_state
        return state(params) if callable(state) else state


class ParameterError(ValueError):
    """A factory's complaint about one parameter (`parameter` is its dotted path under `parameters`)."""

    def __init__(self, parameter: str, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.parameter = parameter
        self.fix = fix


class DuplicatePluginTypeError(ValueError):
    pass


class Registry:
    """Plugin types by name, aliases included. `register` refuses a name (type or alias) twice."""

    def __init__(self) -> None:
        self._specs: dict[str, PluginSpec] = {}  # by type
        self._names: dict[str, PluginSpec] = {}  # by type and by alias
        self._origin: dict[str, str] = {}

    def register(self, spec: PluginSpec, *, origin: str = "epick") -> None:
        for name in (spec.type, *spec.aliases):
            if name in self._names:
                owner = self._names[name].type
                raise DuplicatePluginTypeError(
                    f"plugin type {name!r} from {origin} is already registered by "
                    f"{self._origin[owner]}" + (f" (as a name of {owner!r})" if owner != name else "")
                )
        self._specs[spec.type] = spec
        self._origin[spec.type] = origin
        for name in (spec.type, *spec.aliases):
            self._names[name] = spec

    def get(self, type_name: str) -> PluginSpec | None:
        """The spec of a type, by its name or one of its aliases."""
        return self._names.get(type_name)

    def types(self) -> list[str]:
        """Every name a config may use: types and aliases."""
        return sorted(self._names)

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._names

    def __iter__(self) -> Iterator[PluginSpec]:
        """Each type once."""
        return iter(self._specs.values())


def default_producer(parameter: str, producer_type: str) -> Callable[[Any, str], tuple[str, ...]]:
    """A spec's `requires`: a producer of `producer_type` (added with default parameters when the
    config has none), unless the plugin's parameter `parameter` names the producer to read."""

    def requires(params: Any, api_version: str = "") -> tuple[str, ...]:
        return () if getattr(params, parameter) else (producer_type,)

    return requires


def producer_for(
    handle: Handle,
    named: str,
    default: str,
    parameter: str,
    *,
    accepts: Callable[[Plugin], bool],
    what: str,
    produces: str,
    fix: str,
) -> Plugin | None:
    """The data producer a consumer reads: the one its parameter `named` names (a `ParameterError` at
    `parameter` when the config has none of that name, or it produces something else), else the
    config's plugin named `default` if it is one, else None."""
    name = named or default
    try:
        plugin = handle.plugin(name)
    except LookupError as e:
        if not named:
            return None
        hint = e.args[1] if len(e.args) > 1 else ""
        raise ParameterError(parameter, f"no {what} named {name!r} in this config", str(hint)) from None
    if not accepts(plugin):
        if not named:
            return None
        raise ParameterError(
            parameter, f"plugin {name!r} ({plugin.typed_name.type}) does not produce {produces}", fix
        )
    return plugin


def typed_producer(
    handle: Handle, named: str, producer_type: str, parameter: str, kind: type[P], *, what: str, produces: str
) -> P | None:
    """`producer_for` where the producer is an instance of `kind`, registered as `producer_type`."""
    plugin = producer_for(
        handle,
        named,
        producer_type,
        parameter,
        accepts=lambda p: isinstance(p, kind),
        what=what,
        produces=produces,
        fix=f"name a plugin of type {producer_type}",
    )
    return plugin if isinstance(plugin, kind) else None
