"""Structural checks by pydantic, reported in gpusched's words.

Every validated input (the profile and plugin arguments, the inventory annotation, the fleet
file) is declared as pydantic models: pydantic checks types, required and unknown keys and
bounds. A failure is still reported the way users know it, ``<field path>: <sentence>``, with the
path spelt as in the input (``scorePlugins[1].weight``, ``gpus[2].memoryMiB``). This module
carries our sentences into a model (:class:`Say`), lets a domain rule fail at a path
(:func:`fail_at`), and reads a ``ValidationError`` back as :class:`Problem` values that each
caller turns into its own error type (``ProfileError``, ``InventoryError``, ``FleetError``).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, GetCoreSchemaHandler, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

SAID = "gpusched_said"  # error type of a Say sentence: the offending value belongs after it
RULE = "gpusched_rule"  # error type of a domain rule: the sentence is complete
BOUNDS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
UNKNOWN_KEY = frozenset({"extra_forbidden", "unexpected_keyword_argument"})

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Say:
    """``Annotated`` metadata: report a failure of this value as ``message`` (pydantic still checks).

    Only failures of the value itself are replaced, never those of the items or fields inside it,
    so ``Annotated[list[Gpu], Say("must be a list")]`` still reports ``gpus[2].memoryMiB``.
    ``kinds`` limits it to those pydantic error types (e.g. :data:`BOUNDS`, so a wrong type keeps
    its own sentence); ``whole`` replaces every failure, for unions whose members add ``loc`` tags.
    A missing required field is reported with its ``Say`` sentence too (see :func:`problems`).
    """

    message: str
    kinds: frozenset[str] = frozenset()
    whole: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(self._check, handler(source))

    def _check(self, value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if any(self._replaces(error["loc"], error["type"]) for error in exc.errors()):
                raise PydanticCustomError(SAID, "{message}", {"message": self.message}) from None
            raise

    def _replaces(self, loc: Loc, kind: str) -> bool:
        return (self.whole or loc == ()) and (not self.kinds or kind in self.kinds)


def rule_error(message: str) -> PydanticCustomError:
    """A domain rule's failure of the value being validated; raise it from a validator."""
    return PydanticCustomError(RULE, "{message}", {"message": message})


def fail_at(loc: Loc, message: str, value: Any) -> ValidationError:
    """A domain rule's failure at ``loc`` (relative to the model or value being validated).

    Raise it from a validator: pydantic prefixes the location of that model, so a rule on a GPU
    says ``gpus[1].index`` without knowing it is the second GPU.
    """
    details = InitErrorDetails(type=rule_error(message), loc=loc, input=value)
    return ValidationError.from_exception_data("gpusched", [details])


@dataclass(frozen=True)
class Problem:
    """One failure, in our terms. ``kind`` is pydantic's error type, :data:`SAID` or :data:`RULE`;
    ``message`` is the sentence (pydantic's own English for kinds the caller does not translate);
    ``value`` is the offending input (None when missing); ``known`` lists the keys the enclosing
    model accepts, for an unknown key."""

    loc: Loc
    kind: str
    message: str
    value: Any
    context: Mapping[str, Any]
    known: tuple[str, ...] = ()

    def path(self, root: str = "", *, parent: bool = False) -> str:
        """``root`` then ``loc`` as ``a.b[1].c``; ``parent``: without the last element."""
        return field_path(self.loc[:-1] if parent else self.loc, root)


def field_path(loc: Loc, root: str = "") -> str:
    """``("scorePlugins", 1, "weight")`` -> ``scorePlugins[1].weight`` (after ``root.`` if given)."""
    text = root
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def problems(exc: ValidationError, root: type[BaseModel] | None = None) -> tuple[Problem, ...]:
    """Each error of ``exc``, in pydantic's order (fields in declaration order, then unknown keys).

    With ``root`` (the model validated), a missing field is reported with its :class:`Say`
    sentence and value None, as if it were null, and an unknown key lists the keys its model knows.
    """
    found = []
    for error in exc.errors(include_url=False):
        loc = _without_key_markers(error["loc"])
        kind, message, value = error["type"], error["msg"], error.get("input")
        context = error.get("ctx") or {}
        if kind in (SAID, RULE):
            message = context["message"]
        known: tuple[str, ...] = ()
        owner = _model_at(root, loc) if root is not None and loc else None
        if kind == "missing":
            value = None
            said = _say_of(owner, loc[-1]) if owner is not None else None
            if said is not None:
                kind, message = SAID, said
        elif kind in UNKNOWN_KEY and owner is not None:
            known = keys_of(owner)
        found.append(Problem(loc, kind, message, value, context, known))
    return tuple(found)


def _without_key_markers(loc: Loc) -> Loc:
    """pydantic marks a dict key's own failure ``(..., 7, "[key]")``; the key is a name, not an index."""
    parts = list(loc)
    for i, part in enumerate(parts):
        if part == "[key]" and i > 0:
            parts[i - 1] = str(parts[i - 1])
    return tuple(p for p in parts if p != "[key]")


def keys_of(model: type[BaseModel]) -> tuple[str, ...]:
    """The input keys ``model`` accepts (aliases where set), in declaration order."""
    return tuple(info.alias or name for name, info in model.model_fields.items())


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model whose field or key ``loc[-1]`` is, following ``loc`` through fields and containers."""
    current: Any = root
    for part in loc[:-1]:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
            current = None if info is None else info.annotation
        elif typing.get_origin(current) in (list, tuple) and isinstance(part, int):
            current = typing.get_args(current)[0]
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` -> ``X``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _say_of(model: type[BaseModel], key: str | int) -> str | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return next((m.message for m in info.metadata if isinstance(m, Say)), None)
    return None
