"""The plugin registry: a name -> factory map that refuses duplicates.

Adding a plugin is one module plus one ``register`` line in ``extender.plugins``; nothing here
knows any plugin. Registries are plain objects passed around, never module globals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PluginFactory:
    """How to build one plugin.

    ``args_type`` is its frozen ``<Plugin>Args`` dataclass, deriving from
    ``extender.framework.args.PluginArgs`` (all fields defaulted; the field types are what pydantic
    checks in the profile's ``pluginArgs``); ``new`` builds the plugin from an instance of it.
    """

    name: str
    args_type: type
    new: Callable[[Any], Any]

    def default_args(self) -> Any:
        return self.args_type()


class Registry:
    """Plugin name -> ``PluginFactory``."""

    def __init__(self, factories: Mapping[str, PluginFactory] | None = None) -> None:
        self._factories: dict[str, PluginFactory] = {}
        for factory in (factories or {}).values():
            self.register(factory)

    def register(self, factory: PluginFactory) -> None:
        if factory.name in self._factories:
            raise ValueError(f"plugin {factory.name!r} is already registered")
        self._factories[factory.name] = factory

    def get(self, name: str) -> PluginFactory | None:
        return self._factories.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[PluginFactory]:
        return iter(self._factories.values())

    def __len__(self) -> int:
        return len(self._factories)
