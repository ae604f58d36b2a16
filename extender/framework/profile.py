"""Scheduling profiles: which plugins run, with which weights and typed arguments.

A profile is validated once, at startup; every error names the field path and the bad value
(``profile.scorePlugins[1].weight: must be a positive integer, got -2``), so a bad ConfigMap
stops the extender instead of misplacing pods. Format (camelCase, as in the ConfigMap)::

    filterPlugins: [MigIsolation, TensorParallel, GpuFit, NvlinkTopology]  # run in this order
    scorePlugins:                      # name, or {name, weight}; weight: int >= 1, default 1
      - {name: NvlinkTopology, weight: 2}
      - TopologyPacking
    pluginArgs:                        # optional, per plugin name: its <Plugin>Args fields
      NvlinkTopology: {requireNvlink: true}

Keys omitted fall back to ``base`` (normally ``extender.plugins.default_profile()``).
A plugin's pre-filter runs when the plugin is listed in ``filterPlugins``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from extender.framework.registry import Registry

ROOT = "profile"


class ProfileError(ValueError):
    """An invalid profile; ``path`` is the offending field (``profile.scorePlugins[1].weight``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass(frozen=True)
class ScorePluginRef:
    name: str
    weight: int = 1


@dataclass(frozen=True)
class ProfileConfig:
    """A validated profile. ``plugin_args`` maps plugin name to its typed ``<Plugin>Args``;
    plugins without an entry use their defaults."""

    filter_plugins: tuple[str, ...] = ()
    score_plugins: tuple[ScorePluginRef, ...] = ()
    plugin_args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def enabled(self) -> tuple[str, ...]:
        """Every plugin the profile uses, in first-mention order."""
        names = list(self.filter_plugins) + [s.name for s in self.score_plugins]
        return tuple(dict.fromkeys(names))


_TOP_KEYS = ("filterPlugins", "scorePlugins", "pluginArgs")


def load_profile(raw: Mapping[str, Any] | None, registry: Registry,
                 base: ProfileConfig | None = None) -> ProfileConfig:
    """Validate a profile mapping (e.g. parsed YAML) against ``registry``.

    Raises ``ProfileError`` naming the first bad field. Plugin arguments are turned into each
    plugin's frozen ``<Plugin>Args`` here, so nothing is parsed later on the hot path.
    """
    base = base or ProfileConfig()
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ProfileError(ROOT, f"must be a mapping, got {_show(raw)}")
    for key in raw:
        if key not in _TOP_KEYS:
            raise ProfileError(f"{ROOT}.{key}", f"unknown key; known: {', '.join(_TOP_KEYS)}")
    filters = base.filter_plugins
    if "filterPlugins" in raw:
        filters = _filter_names(raw["filterPlugins"], registry)
    scores = base.score_plugins
    if "scorePlugins" in raw:
        scores = _score_refs(raw["scorePlugins"], registry)
    args = dict(base.plugin_args)
    if "pluginArgs" in raw:
        args.update(_plugin_args(raw["pluginArgs"], registry))
    return ProfileConfig(filters, scores, MappingProxyType(args))


def parse_args(args_type: type, raw: Any, path: str) -> Any:
    """Build a frozen ``<Plugin>Args`` from a camelCase mapping.

    Field types follow the defaults (bool, int, float, str); unknown keys are errors; finally the
    dataclass's ``validate()`` (if any) returns ``(field, message)`` problems, reported by path.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ProfileError(path, f"must be a mapping of arguments, got {_show(raw)}")
    fields = {_camel(f.name): f for f in dataclasses.fields(args_type)}
    values = {}
    for key, value in raw.items():
        spec = fields.get(key)
        if spec is None:
            known = ", ".join(fields) or "none"
            raise ProfileError(f"{path}.{key}", f"unknown argument; known: {known}")
        values[spec.name] = _typed(value, _default(spec), f"{path}.{key}")
    args = args_type(**values)
    validate = getattr(args, "validate", None)
    for field_name, message in (validate() if validate else []):
        value = getattr(args, field_name)
        raise ProfileError(f"{path}.{_camel(field_name)}", f"{message}, got {_show(value)}")
    return args


def _filter_names(raw: Any, registry: Registry) -> tuple[str, ...]:
    path = f"{ROOT}.filterPlugins"
    if not isinstance(raw, list):
        raise ProfileError(path, f"must be a list of plugin names, got {_show(raw)}")
    names: list[str] = []
    for i, name in enumerate(raw):
        _check_name(name, registry, f"{path}[{i}]")
        if name in names:
            raise ProfileError(f"{path}[{i}]", f"plugin {name!r} is listed twice")
        names.append(name)
    return tuple(names)


def _score_refs(raw: Any, registry: Registry) -> tuple[ScorePluginRef, ...]:
    path = f"{ROOT}.scorePlugins"
    if not isinstance(raw, list):
        raise ProfileError(path, f"must be a list of {{name, weight}}, got {_show(raw)}")
    refs: list[ScorePluginRef] = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, Mapping):
            raise ProfileError(where, f"must be a plugin name or {{name, weight}}, got {_show(item)}")
        for key in item:
            if key not in ("name", "weight"):
                raise ProfileError(f"{where}.{key}", "unknown key; known: name, weight")
        name = item.get("name")
        _check_name(name, registry, f"{where}.name")
        weight = item.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise ProfileError(f"{where}.weight", f"must be a positive integer, got {_show(weight)}")
        if any(r.name == name for r in refs):
            raise ProfileError(f"{where}.name", f"plugin {name!r} is listed twice")
        refs.append(ScorePluginRef(name, weight))
    return tuple(refs)


def _plugin_args(raw: Any, registry: Registry) -> dict[str, Any]:
    path = f"{ROOT}.pluginArgs"
    if not isinstance(raw, Mapping):
        raise ProfileError(path, f"must be a mapping from plugin name to arguments, got {_show(raw)}")
    parsed = {}
    for name, value in raw.items():
        _check_name(name, registry, f"{path}.{name}")
        factory = registry.get(name)
        assert factory is not None
        parsed[name] = parse_args(factory.args_type, value, f"{path}.{name}")
    return parsed


def _check_name(name: Any, registry: Registry, path: str) -> None:
    if not isinstance(name, str) or not name:
        raise ProfileError(path, f"must be a plugin name, got {_show(name)}")
    if name not in registry:
        raise ProfileError(path, f"unknown plugin {name!r}; registered: {', '.join(registry.names())}")


def _typed(value: Any, default: Any, path: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ProfileError(path, f"must be true or false, got {_show(value)}")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(path, f"must be an integer, got {_show(value)}")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(path, f"must be a number, got {_show(value)}")
        value = float(value)
    elif isinstance(default, str) and not isinstance(value, str):
        raise ProfileError(path, f"must be a string, got {_show(value)}")
    return value


def _default(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return spec.default_factory()  # type: ignore[misc]
    return None


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else ("null" if value is None else str(value))
