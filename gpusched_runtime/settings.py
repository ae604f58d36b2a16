"""Typed, validated settings of a gpusched program, and its command line generated from them (as
vLLM derives its CLI from its config classes). The extender, the node agent and the engine sidecar
each declare one :class:`SettingsModel`; this module is the machinery they share.

Each field of a program's model carries everything about one setting: its type and default, its
help text (the docstring under it), its bounds (pydantic ``Field``), and, where the defaults don't
fit, a :class:`Flag` (the flag's name and aliases, its parser, e.g. durations, the environment
variable that gives its default). :func:`build_parser` makes the argparse parser from
:func:`options`, one flag per field whose ``dest`` is the field's name, and :func:`settings_from`
makes the model from the parsed flags, so a setting cannot exist in one place and be forgotten in
the other. Built once at startup; a bad value fails startup with a :class:`SettingsError` whose
message starts with the field's name and its flag.

How a field becomes a flag: ``--`` + the field's name, dashed (``Flag.name`` overrides it); a bool
is a switch (it must default to False); a ``Literal`` is a choice; ``int``, ``float`` and ``str``
parse as such (``Flag.parse`` overrides it); ``tuple[str, ...]`` is a repeatable flag; a field
without a default is a required flag.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, ValidationError, model_validator


class SettingsError(Exception):
    """A setting is invalid; the message starts with the field's name and says what to fix.

    Not a ``ValueError``: pydantic would wrap one raised from a validator into its own error."""


def parse_seconds(text: str) -> float:
    """A duration as kube-scheduler's config writes it ("60s", "1m", "1500ms") or plain seconds.
    Raises ``ValueError`` naming the text; the range is checked by the field, not here."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    number, unit = text.strip(), "s"
    for suffix in ("ms", "s", "m"):
        if number.endswith(suffix):
            number, unit = number[: -len(suffix)], suffix
            break
    try:
        return float(number) * units[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a duration; write e.g. 60s, 1m or 1500ms") from None


def whole_number(low: int) -> Callable[[str], int]:
    """A parser of whole numbers >= ``low``, for a count whose bound should fail on the command line
    itself (a usage error naming the flag) as well as in the model (give the field ``Field(ge=low)``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be a whole number >= {low}, got {text!r}") from None
        if value < low:
            raise ValueError(f"must be a whole number >= {low}, got {value}")
        return value
    return parse


@dataclass(frozen=True)
class Flag:
    """How a settings field appears on the command line where the defaults don't fit.

    ``name``: the flag (default ``--`` + the field name, dashed); ``aliases``: more spellings (``-tp``);
    ``parse``: text to value, raising ``ValueError`` with a readable message (default: from the
    field's type); ``metavar``: the placeholder in ``--help``; ``duration``: the value is seconds
    and ``--help`` shows it as ``60s``; ``env``: an environment variable whose value, when set and
    not empty, is the flag's default (read when the parser is built, parsed like the flag)."""

    name: str = ""
    aliases: tuple[str, ...] = ()
    parse: Callable[[str], Any] | None = None
    metavar: str = ""
    duration: bool = False
    env: str = ""


def duration_flag(name: str = "", *, env: str = "") -> Flag:
    """The flag of a seconds field that accepts kube-scheduler's durations (:func:`parse_seconds`)."""
    return Flag(name=name, parse=parse_seconds, metavar="DURATION", duration=True, env=env)


class SettingsModel(BaseModel):
    """The base of a program's settings: frozen, strict, every field documented (its docstring is the
    flag's help). Construction validates every field's bounds and the subclass's rules between
    fields, and raises :class:`SettingsError` (never pydantic's ``ValidationError``) naming the
    first bad field and its flag. A rule between fields raises :class:`SettingsError` itself,
    starting with the field to change and naming the flag to fix."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)

    @model_validator(mode="wrap")
    @classmethod
    def _name_the_field(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            raise SettingsError("; ".join(_describe(cls, error) for error in exc.errors())) from None


@dataclass(frozen=True)
class Option:
    """One command-line flag, derived from one settings field by :func:`options`.

    ``parse`` is None for a switch (a bool field, False unless the flag is given); ``shown_default``
    is the default as ``--help`` writes it ("" when there is none worth showing); ``required``: the
    field has no default; ``repeated``: the flag may be given many times (a tuple field)."""

    field: str
    flag: str
    aliases: tuple[str, ...]
    help: str
    default: Any
    parse: Callable[[str], Any] | None
    choices: tuple[str, ...] | None
    metavar: str
    shown_default: str
    env: str
    required: bool
    repeated: bool


def options(model: type[SettingsModel]) -> tuple[Option, ...]:
    """Every field of ``model`` as a flag, in field order. Raises ``TypeError`` for a field whose flag
    cannot be derived (no help text, a bool that defaults to True, a type without a parser)."""
    return tuple(_option(model, name) for name in model.model_fields)


def build_parser(model: type[SettingsModel], *, prog: str, description: str, epilog: str = "") -> argparse.ArgumentParser:
    """The command line of ``model``: one flag per field (see :func:`options`), whose ``dest`` is the
    field's name, so :func:`settings_from` is a plain mapping. Environment defaults are read now."""
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog or None)
    for option in options(model):
        text = option.help.replace("%", "%%") + (f" (default: {option.shown_default})" if option.shown_default else "")
        names = (option.flag, *option.aliases)
        if option.parse is None:
            p.add_argument(*names, dest=option.field, action="store_true", help=text)
            continue
        default = (os.environ.get(option.env) or option.default) if option.env else option.default
        p.add_argument(*names, dest=option.field, type=_argparse_type(option.parse), help=text,
                       action="append" if option.repeated else "store", required=option.required,
                       default=list(default) if option.repeated else None if option.required else default,
                       choices=option.choices, metavar=None if option.choices else option.metavar or None)
    return p


def settings_from(model: type[SettingsModel], args: argparse.Namespace | dict[str, Any]) -> Any:
    """The ``model`` the parsed flags name (a repeated flag's list as a tuple); raises
    :class:`SettingsError` naming the first bad one."""
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    return model(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as argparse wants it: a builtin type as is (argparse names it in its message), any
    other parser's ``ValueError`` as its own message."""
    if isinstance(parse, type):
        return parse

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def _option(model: type[SettingsModel], name: str) -> Option:
    info = model.model_fields[name]
    if not info.description:
        raise TypeError(f"{model.__name__}.{name}: give it a docstring; it is the flag's --help")
    flag = _flag(model, name)
    annotation = _without_none(info.annotation)
    repeated = typing.get_origin(annotation) is tuple
    if repeated:
        annotation = _repeated_item(model, name, annotation)
    choices = tuple(typing.get_args(annotation)) if typing.get_origin(annotation) is Literal else None
    parse = flag.parse
    if annotation is bool:
        if info.default is not False:
            raise TypeError(f"{model.__name__}.{name}: a switch must default to False")
    elif parse is None:
        parse = _parser_of(annotation, choices)
        if parse is None:
            raise TypeError(f"{model.__name__}.{name}: no parser for {annotation!r}; give it a Flag(parse=...)")
    required = info.is_required()
    default = None if required else info.get_default(call_default_factory=True)
    unshown = default is None or default is False or default == "" or default == ()
    shown = "" if unshown else f"{default:g}s" if flag.duration else str(default)
    if flag.env:
        shown = f"${flag.env}" + (f" or {shown}" if shown else "")
    return Option(field=name, flag=_flag_name(model, name), aliases=flag.aliases, help=info.description,
                  default=default, parse=parse, choices=choices, metavar=flag.metavar, shown_default=shown,
                  env=flag.env, required=required, repeated=repeated)


def _flag(model: type[SettingsModel], name: str) -> Flag:
    return next((m for m in model.model_fields[name].metadata if isinstance(m, Flag)), Flag())


def _flag_name(model: type[SettingsModel], name: str) -> str:
    return _flag(model, name).name or "--" + name.replace("_", "-")


def _repeated_item(model: type[SettingsModel], name: str, annotation: Any) -> Any:
    """``tuple[X, ...]`` -> ``X``; any other tuple has no flag."""
    args = typing.get_args(annotation)
    if len(args) != 2 or args[1] is not Ellipsis:
        raise TypeError(f"{model.__name__}.{name}: a repeated flag is a tuple[X, ...], not {annotation!r}")
    return args[0]


def _parser_of(annotation: Any, choices: tuple[str, ...] | None) -> Callable[[str], Any] | None:
    """The parser a field's type implies: int, float and str (choices are strings); None for any other."""
    if choices is not None or annotation is str:
        return str
    if annotation is int:
        return int
    if annotation is float:
        return float
    return None


def _without_none(annotation: Any) -> Any:
    """``str | None`` -> ``str``: an optional setting is parsed as its type (the default is None)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _describe(model: type[SettingsModel], error: Any) -> str:
    """One pydantic error as ``field (--flag): must be ..., got VALUE``."""
    field = ".".join(str(part) for part in error["loc"]) or "settings"
    flag = f" ({_flag_name(model, field)})" if field in model.model_fields else ""
    if error["type"] == "extra_forbidden":
        return f"{field}: not a setting"
    if error["type"] == "missing":
        return f"{field}{flag}: required"
    if error["type"] == "value_error":
        what = str(error["ctx"]["error"])
    else:
        what = str(error["msg"]).replace("Input should be", "must be", 1)
    return f"{field}{flag}: {what}, got {error['input']!r}"

