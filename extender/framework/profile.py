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

The shape is checked by pydantic (:class:`_Profile`); the rules that need the registry (a name
is registered, listed once) are validators on it; failures become :class:`FieldError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel

from extender.framework.args import argument_names, sentence, show
from extender.framework.registry import Registry
from gpusched_api.errors import FieldError
from gpusched_api.validation import RULE, UNKNOWN_KEY, Problem, Say, fail_at, first_problem, rule_error

ROOT = "profile"


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


def load_profile(raw: Mapping[str, Any] | None, registry: Registry,
                 base: ProfileConfig | None = None) -> ProfileConfig:
    """Validate a profile mapping (e.g. parsed YAML) against ``registry``.

    Raises ``FieldError`` naming the first bad field. Plugin arguments are turned into each
    plugin's frozen ``<Plugin>Args`` here, so nothing is parsed later on the hot path.
    """
    base = base or ProfileConfig()
    try:
        profile = _Profile.model_validate({} if raw is None else raw, context={"registry": registry})
    except ValidationError as exc:
        raise _profile_error(first_problem(exc, _Profile), "key") from None
    given = profile.model_fields_set
    filters = tuple(profile.filter_plugins) if "filter_plugins" in given else base.filter_plugins
    scores = base.score_plugins
    if "score_plugins" in given:
        scores = tuple(ScorePluginRef(ref.name, ref.weight) for ref in profile.score_plugins)
    args = dict(base.plugin_args)
    for name, value in profile.plugin_args.items():
        factory = registry.get(name)
        assert factory is not None  # the model checked the name
        args[name] = parse_args(factory.args_type, value, f"{ROOT}.pluginArgs.{name}")
    return ProfileConfig(filters, scores, MappingProxyType(args))


def parse_args(args_type: type, raw: Any, path: str) -> Any:
    """Build a frozen ``<Plugin>Args`` (an ``extender.framework.args.PluginArgs``) from a camelCase mapping.

    pydantic checks the field types and bounds its annotations declare and refuses unknown keys;
    the first failure is raised as ``FieldError`` under ``path``. ``None`` means no arguments.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise FieldError(path, f"must be a mapping of arguments, got {show(raw)}")
    try:
        return TypeAdapter(args_type).validate_python(dict(raw))
    except ValidationError as exc:
        problem = replace(first_problem(exc, args_type), known=argument_names(args_type))
        raise _profile_error(problem, "argument", path) from None


def _registered(name: str, info: ValidationInfo) -> str:
    """The name is registered (the registry comes in the validation context)."""
    registry: Registry = (info.context or {})["registry"]
    if name not in registry:
        raise rule_error(f"unknown plugin {name!r}; registered: {', '.join(registry.names())}")
    return name


PluginName = Annotated[StrictStr, Field(min_length=1), Say("must be a plugin name"), AfterValidator(_registered)]
"""A registered plugin's name."""


def _listed_once(names: list[str], where: tuple[str, ...]) -> None:
    """No name twice; the failure is at the second mention (``[i]`` then ``where``)."""
    for i, name in enumerate(names):
        if name in names[:i]:
            raise fail_at((i, *where), f"plugin {name!r} is listed twice", name)


def _name_only(item: Any) -> Any:
    """A bare plugin name in ``scorePlugins`` means that plugin with weight 1."""
    return {"name": item} if isinstance(item, str) else item


class _ScoreRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: PluginName
    weight: Annotated[StrictInt, Field(ge=1), Say("must be a positive integer")] = 1


class _Profile(BaseModel):
    """The profile as written; a key that is absent is not in ``model_fields_set``."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel)

    filter_plugins: Annotated[list[PluginName], Strict(), Say("must be a list of plugin names")] = []
    score_plugins: Annotated[
        list[Annotated[_ScoreRef, BeforeValidator(_name_only), Say("must be a plugin name or {name, weight}")]],
        Strict(), Say("must be a list of {name, weight}")] = []
    plugin_args: Annotated[dict[PluginName, Any], Say("must be a mapping from plugin name to arguments")] = {}

    @field_validator("filter_plugins")
    @classmethod
    def _filters_once(cls, names: list[str]) -> list[str]:
        _listed_once(names, ())
        return names

    @field_validator("score_plugins")
    @classmethod
    def _scores_once(cls, refs: list[_ScoreRef]) -> list[_ScoreRef]:
        _listed_once([ref.name for ref in refs], ("name",))
        return refs


def _profile_error(problem: Problem, noun: str, root: str = ROOT) -> FieldError:
    """The problem in the profile's words; ``noun`` names what an unknown key is ("key", "argument")."""
    path = problem.path(root)
    if problem.kind in UNKNOWN_KEY:
        return FieldError(path, f"unknown {noun}; known: {', '.join(problem.known) or 'none'}")
    if problem.kind == RULE:
        return FieldError(path, problem.message)
    text = "must be a mapping" if problem.kind == "model_type" else sentence(problem)
    return FieldError(path, f"{text}, got {show(problem.value)}")
