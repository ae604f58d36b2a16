"""EngineLoad: headroom from engine samples, and the score it gives."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from extender.model.telemetry import EngineSample, NodeTelemetry, engine_headroom
from extender.plugins.engine_load import EngineLoad, EngineLoadArgs
from tests.unit.builders import h100_inventory, make_node


def report(*engines: EngineSample) -> NodeTelemetry:
    return NodeTelemetry("n", 1, 0.0, 1.0, "fake", MappingProxyType({}), engines)


def engine(kv: float, running: int = 4, waiting: int = 0, stale: bool = False) -> EngineSample:
    return EngineSample("ns/e", "m", kv, running, waiting, 0, 1000, stale=stale)


@pytest.mark.parametrize("engines,expected", [
    pytest.param((), None, id="no-engines"),
    pytest.param((engine(0.0),), 10, id="idle"),
    pytest.param((engine(0.35),), 6, id="kv-35pct"),
    pytest.param((engine(0.2), engine(0.9)), 1, id="fullest-decides"),
    pytest.param((engine(0.4, running=2, waiting=3),), 3, id="queueing-halves"),
    pytest.param((engine(1.3),), 0, id="over-full-clamped"),
    pytest.param((engine(0.9, stale=True),), None, id="stale-ignored"),
])
def test_engine_headroom(engines, expected):
    assert engine_headroom(report(*engines)) == expected


@pytest.mark.parametrize("headroom,args,expected", [
    pytest.param(None, EngineLoadArgs(), 100, id="unknown-default"),
    pytest.param(None, EngineLoadArgs(unknown_score=80), 80, id="unknown-configured"),
    pytest.param(10, EngineLoadArgs(), 100, id="idle"),
    pytest.param(3, EngineLoadArgs(), 30, id="busy"),
])
def test_score(headroom, args, expected):
    from extender.model.snapshot import make_node_info

    node = make_node_info("n", h100_inventory("n"), engine_headroom=headroom)
    assert EngineLoad(args).score(None, None, node) == expected


def test_headroom_is_part_of_the_shape():
    from extender.model.snapshot import make_node_info

    a = make_node_info("a", h100_inventory("a"), engine_headroom=3)
    b = make_node_info("b", h100_inventory("b"), engine_headroom=9)
    assert a.shape != b.shape and make_node_info("c", h100_inventory("c"), engine_headroom=3).shape == a.shape
    assert make_node("d", h100_inventory("d")).engine_headroom is None


def test_args_validation_names_the_field():
    assert EngineLoadArgs(unknown_score=101).validate() == [("unknown_score", "must be between 0 and 100")]
