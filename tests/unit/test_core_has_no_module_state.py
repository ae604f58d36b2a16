"""Issue 17: the pure decision core keeps no mutable state at module level. A module-level cache
is shared by every decider in the process (tests, benchmarks, the coming plugin service), and
answers leak between them; state with a lifetime belongs to an object (the framework, the
decider, the snapshot). Constant tables are frozen (frozenset, MappingProxyType, tuples).

Issue 41: the same holds for the runtime package every program imports (``gpusched_runtime``): a
module-level value there would be shared by the extender's and the agent's objects alike. And for
``gpusched_api``, the names and schema every program imports (its generated protobuf modules aside:
their descriptors belong to protobuf's own pool, and we do not write that code); and for the
extender's composition root, cluster state, gangs and DRA, whose objects a test or a replica builds
anew."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import logging
import pkgutil
import re
import struct
import types
import typing

import numpy
import pytest

import extender.assembly
import extender.framework
import extender.model
import extender.plugins
import extender.service.dra
import extender.service.gangs
import extender.service.state
import gpusched_api
import gpusched_runtime

IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range, types.MappingProxyType,
             enum.Enum, re.Pattern, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type,
             typing.TypeVar, struct.Struct, numpy.dtype)


GENERATED = re.compile(r"_pb2(_grpc)?$")


def core_modules():
    for package in (extender.model, extender.framework, extender.plugins, gpusched_api):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not GENERATED.search(info.name):
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


def composed_modules():
    """Issue 41: the composition root, the cluster state, the gang coordinator and DRA's service
    part, split into packages, and the one telemetry change test both processes share."""
    for package in (extender.assembly, extender.service.state, extender.service.gangs, extender.service.dra):
        yield package.__name__
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            yield info.name
    yield "extender.service.telemetry_change"


@pytest.mark.parametrize("module", sorted(core_modules()))
def test_the_module_holds_no_mutable_value(module):
    found = {name: type(value).__name__ for name, value in vars(importlib.import_module(module)).items()
             if not name.startswith("__") and mutable(value)}
    assert not found, f"{module} holds mutable module-level state {found}: move it onto the object that owns its lifetime"


def runtime_modules():
    for info in pkgutil.walk_packages(gpusched_runtime.__path__, gpusched_runtime.__name__ + "."):
        yield info.name


@pytest.mark.parametrize("module", sorted([*runtime_modules(), *composed_modules()]))
def test_the_module_holds_no_mutable_value_but_its_logger(module):
    # A module's logger is allowed: it is an entry of the logging module's registry, configured by
    # the program (its level, its handlers), not state this module keeps.
    found = {name: type(value).__name__ for name, value in vars(importlib.import_module(module)).items()
             if not name.startswith("__") and mutable(value) and not isinstance(value, logging.Logger)}
    assert not found, f"{module} holds mutable module-level state {found}: move it onto the object that owns its lifetime"


def test_the_runtime_package_is_checked():
    assert {"gpusched_runtime.backoff", "gpusched_runtime.reflector", "gpusched_runtime.settings"} <= set(runtime_modules())


def test_the_api_package_is_checked():
    modules = set(core_modules())
    assert {"gpusched_api.names", "gpusched_api.inventory", "gpusched_api.telemetry.v1.bounds"} <= modules
    assert not any(GENERATED.search(m) for m in modules)


def test_the_check_catches_a_module_level_cache():
    from extender.model.nodemaps import RecentAnswers

    assert mutable({}) and mutable([]) and mutable(set()) and mutable(RecentAnswers(16))
    assert not mutable(types.MappingProxyType({})) and not mutable(frozenset())
