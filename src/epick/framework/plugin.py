"""What every plugin is: an object with a type and a name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from epick.framework.reads import Reads


@dataclass(frozen=True, slots=True)
class TypedName:
    """A plugin's identity: its config `type` and its instance `name` (shown as `name/type`)."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.name}/{self.type}"


@runtime_checkable
class Plugin(Protocol):
    """Anything with a typed name. Extension points are separate protocols a plugin may add."""

    @property
    def typed_name(self) -> TypedName: ...


class NamedPlugin:
    """A convenience for plugin classes: `plugin_type` and what the plugin reads (`Reads`) on the class,
    `name` per instance.

    A plugin that reads `Reads.HISTORY` also says, on its spec (`PluginSpec.worker_state`), what it
    keeps from earlier requests that `epick serve --workers` does not share between its processes;
    see `epick.framework.replication.unshared_state`."""

    plugin_type: ClassVar[str] = ""
    reads: ClassVar[Reads] = Reads.EVERYTHING

    def __init__(self, name: str | None = None) -> None:
        self._typed_name = TypedName(self.plugin_type, name or self.plugin_type)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def name(self) -> str:
        return self._typed_name.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._typed_name}>"


def state_key(plugin: Plugin) -> str:
    """The CycleState key a plugin writes under."""
    return str(plugin.typed_name)
