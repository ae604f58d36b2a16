"""Issue 17: the pure decision core keeps no mutable state at module level. A module-level cache
is shared by every decider in the process (tests, benchmarks, the coming plugin service), and
answers leak between them; state with a lifetime belongs to an object (the framework, the
decider, the snapshot). Constant tables are frozen (frozenset, MappingProxyType, tuples)."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import pkgutil
import re
import struct
import types
import typing

import numpy
import pytest

import extender.framework
import extender.model
import extender.plugins

IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range, types.MappingProxyType,
             enum.Enum, re.Pattern, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type,
             typing.TypeVar, struct.Struct, numpy.dtype)


def core_modules():
    for package in (extender.model, extender.framework, extender.plugins):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            yield info.name


def mutable(value) -> bool:
    if isinstance(value, IMMUTABLE) or callable(value) or type(value) is object:  # object(): a sentinel
        return False
    if isinstance(value, tuple | frozenset):
        return any(mutable(v) for v in value)
    if dataclasses.is_dataclass(value):
        return not type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]
    if type(value).__module__ in ("__future__", "typing", "typing_extensions"):
        return False  # annotations feature flags, aliases
    return True


@pytest.mark.parametrize("module", sorted(core_modules()))
def test_the_module_holds_no_mutable_value(module):
    found = {name: type(value).__name__ for name, value in vars(importlib.import_module(module)).items()
             if not name.startswith("__") and mutable(value)}
    assert not found, f"{module} holds mutable module-level state {found}: move it onto the object that owns its lifetime"


def test_the_check_catches_a_module_level_cache():
    from extender.model.nodemaps import RecentAnswers

    assert mutable({}) and mutable([]) and mutable(set()) and mutable(RecentAnswers(16))
    assert not mutable(types.MappingProxyType({})) and not mutable(frozenset())
