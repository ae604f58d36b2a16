"""The base of every plugin's ``<Plugin>Args``, and the sentences its failures are reported with.

A ``<Plugin>Args`` is a frozen dataclass deriving from :class:`PluginArgs`; its field types say
what pydantic checks (``StrictBool``, ``StrictInt``, ``Annotated[..., Field(ge=0, le=100)]``) and
its defaults are the plugin's defaults. The profile's ``pluginArgs`` entries are validated against
it once, at startup (``extender.framework.profile.parse_args``); the plugin reads plain attributes.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

from pydantic import ConfigDict, Field, StrictInt, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from gpusched_api.validation import BOUNDS, RULE, SAID, Problem, Say, problems

# Sentences for the failures of profile and argument values that no Say replaces.
SENTENCES = MappingProxyType({
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
})

Score = Annotated[StrictInt, Field(ge=0, le=100), Say("must be between 0 and 100", kinds=BOUNDS)]
"""A raw plugin score, 0..100; not a bool."""


class PluginArgs:
    """Base of every ``<Plugin>Args`` (a frozen dataclass): camelCase keys, unknown keys refused.

    The config is pydantic's; ``validate()`` reports what it finds wrong with an instance built in
    code (``[("unknown_score", "must be between 0 and 100")]``, empty when valid).
    """

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid", alias_generator=to_camel)

    def validate(self) -> list[tuple[str, str]]:
        """(field name, sentence) for each field pydantic rejects; ``[]`` when the instance is valid."""
        fields = dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()
        names = {to_camel(f.name): f.name for f in fields}
        values = {camel: getattr(self, name) for camel, name in names.items()}
        try:
            TypeAdapter(type(self)).validate_python(values)
        except ValidationError as exc:
            return [(names.get(str(p.loc[0]), str(p.loc[0])) if p.loc else "", sentence(p))
                    for p in problems(exc, type(self))]
        return []


def argument_names(args_type: type) -> tuple[str, ...]:
    """The camelCase keys a ``<Plugin>Args`` accepts, in declaration order."""
    if not dataclasses.is_dataclass(args_type):
        return ()
    return tuple(to_camel(f.name) for f in dataclasses.fields(args_type))


def sentence(problem: Problem) -> str:
    """What is wrong, without the offending value: ``must be an integer``."""
    if problem.kind in (SAID, RULE):
        return problem.message
    return SENTENCES.get(problem.kind, problem.message)


def show(value: Any) -> str:
    """A value as the profile's YAML spells it: ``true``, ``null``, ``'GpuFit'``, ``-2``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else ("null" if value is None else str(value))
