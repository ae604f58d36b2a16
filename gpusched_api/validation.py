"""Structural checks by pydantic, reported in gpusched's words.

Every validated input (the profile and plugin arguments, the inventory annotation, the fleet
file) is declared as pydantic models: pydantic checks types, required and unknown keys and
bounds. A failure is still reported the way users know it, ``<field path>: <sentence>``, with the
path spelt as in the input (``scorePlugins[1].weight``, ``gpus[2].memoryMiB``). This module
carries our sentences into a model (:class:`Say`), lets a domain rule fail at a path
(:func:`fail_at`), and reads a ``ValidationError`` back as :class:`Problem` values that each
caller turns into a :class:`gpusched_api.errors.FieldError` at its own path.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

SAID = "gpusched_said"  # a failure that took its Say sentence: the offending value belongs after it
RULE = "gpusched_rule"  # error type of a domain rule: the sentence is complete
BOUNDS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
UNKNOWN_KEY = frozenset({"extra_forbidden", "unexpected_keyword_argument"})

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Say:
    """``Annotated`` metadata: the sentence for a failure of this value (pydantic still checks it).

    Only failures of the value itself take it, never those of the items or fields inside it, so
    ``Annotated[list[Gpu], Say("must be a list")]`` still reports ``gpus[2].memoryMiB`` in its own
    words. ``kinds`` limits it to those pydantic error types (e.g. :data:`BOUNDS`, so a wrong type
    keeps its own sentence); ``whole`` also covers failures inside a union's members. A missing
    required field is reported with its ``Say`` too. Pure metadata: it adds nothing to validation,
    which stays in pydantic's compiled core; :func:`problems` reads it back when something fails.
    """

    message: str
    kinds: frozenset[str] = frozenset()
    whole: bool = False

    def covers(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds


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



def reject_repeats(located: Iterable[tuple[Loc, Hashable]], describe: Callable[[Any], str]) -> None:
    """Raise :func:`fail_at` at the first value seen before (``describe(value)`` the sentence); for
    uniqueness rules on a model (GPU indices, UUIDs)."""
    seen: set[Hashable] = set()
    for loc, value in located:
        if value in seen:
            raise fail_at(loc, describe(value), value)
        seen.add(value)


def check_islands(islands: Sequence[Sequence[int]], gpu_indices: Collection[int]) -> None:
    """NVLink islands over known GPUs, each GPU in one island once: raise :func:`fail_at` at the
    first member (``nvlinkIslands[i][j]``) that names no GPU or is in an island already."""
    seen: set[int] = set()
    for i, island in enumerate(islands):
        for j, member in enumerate(island):
            if member not in gpu_indices:
                raise fail_at(("nvlinkIslands", i, j), f"GPU index {member} is not in gpus", member)
            if member in seen or list(island).count(member) > 1:
                raise fail_at(("nvlinkIslands", i, j), f"GPU index {member} is in two islands", member)
        seen.update(island)

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


def problems(exc: ValidationError, root: Any = None) -> tuple[Problem, ...]:
    """Each error of ``exc``, in pydantic's order (fields in declaration order, then unknown keys).

    With ``root`` (the type validated), a failure takes the :class:`Say` sentence of the value
    that failed, a missing field is reported as if it were null (with its ``Say``), and an
    unknown key lists the keys its model knows.
    """
    found = []
    for error in exc.errors(include_url=False):
        raw_loc = tuple(error["loc"])
        loc = _without_key_markers(raw_loc)
        kind, message, value = error["type"], error["msg"], error.get("input")
        context = error.get("ctx") or {}
        if kind == RULE:
            message = context["message"]
        known: tuple[str, ...] = ()
        if kind == "missing":
            value = None
        if root is not None and kind != RULE:
            said, at = _say_at(root, raw_loc)
            if said is not None and (kind == "missing" or said.covers(kind)):
                kind, message, loc = SAID, said.message, _without_key_markers(at)
            elif kind in UNKNOWN_KEY:
                owner = _annotation_at(root, raw_loc[:-1])[0]
                known = keys_of(owner) if _is_model(owner) else ()
        found.append(Problem(loc, kind, message, value, context, known))
    return tuple(found)


def first_problem(exc: ValidationError, root: Any = None) -> Problem:
    """The problem to report: an unknown key if there is one (the outermost), else pydantic's first.

    A misspelt key is both unknown and leaves its field missing; the unknown key is what to fix.
    """
    found = problems(exc, root)
    unknown = [p for p in found if p.kind in UNKNOWN_KEY]
    return min(unknown, key=lambda p: len(p.loc)) if unknown else found[0]


def keys_of(model: type[BaseModel]) -> tuple[str, ...]:
    """The input keys ``model`` accepts (aliases where set), in declaration order."""
    return tuple(info.alias or name for name, info in model.model_fields.items())


def _without_key_markers(loc: Loc) -> Loc:
    """pydantic marks a dict key's own failure ``(..., 7, "[key]")``; the key is a name, not an index."""
    parts = list(loc)
    for i, part in enumerate(parts):
        if part == "[key]" and i > 0:
            parts[i - 1] = str(parts[i - 1])
    return tuple(p for p in parts if p != "[key]")


def _say_at(root: Any, loc: Loc) -> tuple[Say | None, Loc]:
    """The Say of the value at ``loc``, or of a ``whole`` union above it; and that value's ``loc``."""
    _, says, rest = _annotation_at(root, loc)
    if rest:  # stopped inside a union's members (their tags)
        return next((s for s in says if s.whole), None), loc[:len(loc) - len(rest)]
    return (says[0] if says else None), loc


def _annotation_at(root: Any, loc: Loc) -> tuple[Any, tuple[Say, ...], Loc]:
    """The type at ``loc``, the Says on it, and what is left of ``loc`` where the walk stopped."""
    annotation, says = _strip(root, ())
    for i, part in enumerate(loc):
        if part == "[key]":
            continue
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if _is_model(annotation) and isinstance(part, str):
            info = next((f for n, f in annotation.model_fields.items() if part in (n, f.alias)), None)
            if info is None:
                return annotation, (), loc[i:]
            annotation, says = _strip(info.annotation, tuple(m for m in info.metadata if isinstance(m, Say)))
        elif dataclasses.is_dataclass(annotation) and isinstance(annotation, type) and isinstance(part, str):
            hints = typing.get_type_hints(annotation, include_extras=True)
            alias = getattr(annotation, "__pydantic_config__", {}).get("alias_generator") or str
            name = next((n for n in hints if part in (n, alias(n))), None)
            if name is None:
                return annotation, (), loc[i:]
            annotation, says = _strip(hints[name], ())
        elif origin in (list, tuple) and isinstance(part, int) and args:
            annotation, says = _strip(args[0], ())
        elif origin is dict and args:
            is_key = loc[i + 1:i + 2] == ("[key]",)
            annotation, says = _strip(args[0] if is_key else args[1], ())
        else:
            return annotation, says, loc[i:]
    return annotation, says, ()


def _strip(annotation: Any, says: tuple[Say, ...]) -> tuple[Any, tuple[Say, ...]]:
    """``Annotated[X, ...]`` and ``X | None`` -> ``X``, collecting the Says on the way."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation, *metadata = typing.get_args(annotation)
            says += tuple(m for m in metadata if isinstance(m, Say))
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation, says
            annotation = members[0]
        else:
            return annotation, says


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
