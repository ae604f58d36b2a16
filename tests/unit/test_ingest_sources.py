"""Issue 45, ingest replicas: the core's ingest process merges many replicas' batches into one per
interval, weighing each replica's word per node (``service.ingest_sources.SourceArbiter``): news
from the node's current source or newer by the agent's own stamps, "stale" only from the node's
source, orphans of a link that ended go stale unless another link hears them in time."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from extender.model.telemetry import GpuSample, NodeTelemetry
from extender.service.ingest_batch import Coalescer, IngestBatch
from extender.service.ingest_sources import SourceArbiter, newer

GIB = 1 << 30


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def value(node: str, seq: int, *, sampled: float | None = None, at: float = 100.0, free_gib: int = 40) -> NodeTelemetry:
    gpu = GpuSample(f"GPU-{node}", 0, 80 * GIB, free_gib * GIB)
    return NodeTelemetry(node, seq, at, 1.0, "fake", MappingProxyType({gpu.uuid: gpu}), (),
                         1_700_000_000.0 + seq if sampled is None else sampled)


def whole(*values: NodeTelemetry) -> IngestBatch:
    return IngestBatch(changed=values, reports=len(values))


def stale(node: str, seq: int) -> IngestBatch:
    return IngestBatch(stale=((node, (100.0, seq, 1_700_000_000.0 + seq)),))


def back(node: str, seq: int) -> IngestBatch:
    return IngestBatch(back=((node, 100.0, seq, 1_700_000_000.0 + seq),))


def arbiter(clock: Clock | None = None) -> SourceArbiter:
    return SourceArbiter(3.0, clock=clock or Clock())


@pytest.mark.parametrize("stamps,than,is_newer", [
    pytest.param((0.0, 5, 10.0), (0.0, 4, 10.0), True, id="higher-sequence"),
    pytest.param((0.0, 1, 11.0), (0.0, 900, 10.0), True, id="restarted-agent-later-clock"),
    pytest.param((0.0, 4, 10.0), (0.0, 4, 10.0), False, id="the-same-report"),
    pytest.param((0.0, 3, 9.0), (0.0, 4, 10.0), False, id="older"),
    pytest.param((99.0, 3, 9.0), (0.0, 4, 10.0), False, id="receive-times-of-two-links-not-compared"),
])
def test_newer_is_judged_by_the_agents_own_stamps(stamps, than, is_newer):
    assert newer(stamps, than) is is_newer


# Each step: (link, batch); then what the merged batch says of node n1.
STEPS = {
    "first-news-from-any-link": ([("a", whole(value("n1", 1)))], dict(changed=[1])),
    "the-source-says-stale": ([("a", whole(value("n1", 1))), ("a", stale("n1", 1))], dict(changed=[1], stale=True)),
    "a-left-link-says-stale-while-another-hears-it": (
        [("a", whole(value("n1", 1))), ("b", whole(value("n1", 2))), ("a", stale("n1", 1))], dict(changed=[2])),
    "a-lagging-link-s-older-value-loses": (
        [("b", whole(value("n1", 5))), ("a", whole(value("n1", 4)))], dict(changed=[5])),
    "a-restarted-agent-on-another-link-wins-by-its-clock": (
        [("a", whole(value("n1", 900))), ("b", whole(value("n1", 1, sampled=1_700_000_950.0)))], dict(changed=[1])),
    "stale-then-heard-again-elsewhere": (
        [("a", whole(value("n1", 1))), ("a", stale("n1", 1)), ("b", back("n1", 3))],
        dict(changed=[1], back=[3])),
    "heard-again-of-a-node-never-valued-is-dropped": ([("a", back("n1", 3))], dict()),
}


@pytest.mark.parametrize("steps,expected", list(STEPS.values()), ids=list(STEPS))
def test_each_links_word_is_weighed_per_node(steps, expected):
    a = arbiter()
    for link, batch in steps:
        a.admit(link, batch)
    merged = a.flush() or IngestBatch()
    assert [v.sequence for v in merged.changed if v.node == "n1"] == expected.get("changed", [])
    assert [seq for node, _, seq, _ in merged.back if node == "n1"] == expected.get("back", [])
    assert any(node == "n1" for node, _ in merged.stale) is expected.get("stale", False)


def test_a_refused_word_is_counted_by_kind():
    a = arbiter()
    a.admit("b", whole(value("n1", 5)))
    a.admit("a", whole(value("n1", 4)))
    a.admit("a", stale("n1", 4))
    assert a.refused == {"news": 1, "stale": 1}


def test_the_orphans_of_a_link_that_ended_go_stale_unless_heard_elsewhere_in_time():
    clock = Clock(100.0)
    a = arbiter(clock)
    a.admit("a", whole(value("moves", 1), value("dies", 1)))
    a.flush()
    a.source_gone("a")
    clock.now = 102.0
    a.admit("b", whole(value("moves", 2, at=102.0)))
    assert a.flush() is not None
    clock.now = 103.5  # past 3 periods from the link's end
    merged = a.flush()
    assert merged is not None and [node for node, _ in merged.stale] == ["dies"]
    assert a.sources() == {"b": 1}


def test_a_link_that_ends_closes_its_streams_for_the_core():
    a = arbiter()
    a.admit("a", IngestBatch(opened=(("ns/agent-1", "n1"), ("ns/agent-2", "n2")), closed=(("ns/agent-2", "n2"),)))
    a.flush()
    a.source_gone("a")
    merged = a.flush()
    assert merged is not None and merged.closed == (("ns/agent-1", "n1"),)


def test_seeded_nodes_are_orphans_until_a_link_hears_them():
    clock = Clock(100.0)
    a = arbiter(clock)
    a.seed((("quiet", 1.0, (90.0, 7, 1_700_000_007.0)), ("talks", 1.0, (90.0, 3, 1_700_000_003.0))))
    clock.now = 101.0
    a.admit("a", whole(value("talks", 4, at=101.0)))
    a.flush()
    clock.now = 103.5
    merged = a.flush()
    assert merged is not None and [node for node, _ in merged.stale] == ["quiet"]


def test_a_node_that_comes_back_later_within_one_interval_is_not_told_stale():
    a = arbiter()
    a.admit("a", whole(value("n1", 1)))
    a.admit("a", stale("n1", 1))
    a.admit("b", back("n1", 2))
    merged = a.flush()
    assert merged is not None and merged.stale == () and [s for _, _, s, _ in merged.back] == [2]


def test_nothing_to_say_is_no_batch():
    assert arbiter().flush() is None


def test_a_replica_ships_a_node_whole_on_every_new_stream_and_everything_on_a_new_link():
    coalescer = Coalescer(3.0, clock=Clock(), sweep_every_s=0.0)
    coalescer.stream_opened(("ns/agent", "n1"))
    coalescer.ingest(value("n1", 1))
    assert [v.sequence for v in coalescer.flush().changed] == [1]
    coalescer.ingest(value("n1", 2))
    quiet = coalescer.flush()
    assert quiet is None or not quiet.changed, "unchanged: not shipped"
    coalescer.stream_closed(("ns/agent", "n1"))
    coalescer.stream_opened(("ns/agent", "n1"))  # the agent came back from another replica
    coalescer.ingest(value("n1", 3))
    assert [v.sequence for v in coalescer.flush().changed] == [3]
    coalescer.relink()  # a new link to the core: everything again
    coalescer.ingest(value("n1", 4))
    batch = coalescer.flush()
    assert batch is not None and [v.sequence for v in batch.changed] == [4]
    assert batch.opened == (("ns/agent", "n1"),) and batch.closed == ()
