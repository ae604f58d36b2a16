"""Issue 18: the ingest process coalesces reports into batches, and the core applies a batch in one
step. A batch carries a node's whole value only when what is judged changed; of every other node
only a freshness transition (issue 45: the child judges freshness, the core hears nothing of a node
that reported without a change) — and the store, the snapshot, staleness and the capacity-rise hook
see the same as when every report was ingested one by one."""

from __future__ import annotations

import pickle

import pytest

from extender.adapters.stream_view import report_to_telemetry
from extender.service.ingest_batch import Coalescer, IngestBatch
from extender.service.state import ClusterState
from extender.service.telemetry import Changes, Heard, TelemetryStore
from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
from tests.unit.builders import h100_inventory, make_k8s_node

GIB, MIB = 1 << 30, 1 << 20


def report(seq: int, *, node: str = "n1", free_gib: float = 40.5, foreign_gib: int = 0, pods: tuple[str, ...] = (),
           kv: float | None = None) -> pb.NodeReport:
    r = pb.NodeReport(node_name=node, sequence=seq, period_millis=1000, gpu_backend="fake",
                      sampled_at_unix_nanos=1_700_000_000_000_000_000 + seq)
    for i in range(2):
        g = r.gpus.add(uuid=f"GPU-{node}-{i}", index=i, memory_total_bytes=80 * GIB,
                       memory_free_bytes=int(free_gib * GIB), foreign_used_bytes=foreign_gib * GIB if i == 0 else 0)
        if i == 0:
            for p in pods:
                g.assigned_pods.add(namespace="ns", name=p)
    if kv is not None:
        r.engines.add(pod=pb.PodRef(namespace="ns", name="e"), kv_cache_usage=kv, requests_running=8)
    return r


def telemetry(seq: int, at: float, **kwargs):
    return report_to_telemetry(report(seq, **kwargs), at)


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def coalescer(clock: Clock | None = None) -> Coalescer:
    """A coalescer judging staleness at 3 periods, sweeping at every flush."""
    return Coalescer(3.0, clock=clock or Clock(), sweep_every_s=0.0)


@pytest.mark.parametrize("second,whole", [
    pytest.param(dict(free_gib=40.6), False, id="jitter-inside-the-GiB"),
    pytest.param(dict(free_gib=30.5), True, id="free-memory-crosses-a-GiB"),
    pytest.param(dict(foreign_gib=20), True, id="foreign-process"),
    pytest.param(dict(pods=("p",)), True, id="kubelet-assignment"),
    pytest.param(dict(kv=0.9), True, id="engine-headroom"),
])
def test_a_node_is_shipped_whole_only_when_what_is_judged_changed(second, whole):
    clock = Clock(1.0)
    c = coalescer(clock)
    c.ingest(telemetry(1, 1.0))
    first = c.flush()
    assert first is not None and [r.node for r in first.changed] == ["n1"] and first.back == ()
    clock.now = 1.5
    c.ingest(telemetry(2, 1.5, **second))
    batch = c.flush()
    if whole:
        assert batch is not None and batch.reports == 1
        assert [r.sequence for r in batch.changed] == [2] and batch.back == () and batch.stale == ()
    else:
        assert batch is None, "a report that changes nothing judged costs the core nothing"
        clock.now = 2.0
        counted = c.flush()
        assert counted == IngestBatch(reports=1), "a quiet ingest still counts its reports, once a second"


def test_only_the_newest_report_per_node_reaches_the_batch():
    c = coalescer()
    for seq in range(1, 6):
        c.ingest(telemetry(seq, float(seq), node="a"))
    c.ingest(telemetry(1, 1.5, node="b"))
    batch = c.flush()
    assert batch is not None and batch.reports == 6
    assert sorted((r.node, r.sequence) for r in batch.changed) == [("a", 5), ("b", 1)]
    assert c.flush() is None, "nothing since: no batch"


def test_a_change_that_reverts_within_one_interval_is_not_shipped():
    c = coalescer()
    c.ingest(telemetry(1, 1.0))
    c.flush()
    c.ingest(telemetry(2, 2.0, foreign_gib=20))
    c.ingest(telemetry(3, 3.0))
    assert c.flush() is None


def test_streams_opened_and_closed_travel_with_the_batch():
    c = coalescer()
    c.stream_opened(("gpusched-system/agent-a", "a"))
    c.stream_closed(("gpusched-system/agent-a", "a"))
    batch = c.flush()
    assert batch is not None and batch.opened == batch.closed == (("gpusched-system/agent-a", "a"),)
    assert c.flush() is None


def test_a_batch_pickles_with_its_whole_values():
    c = coalescer()
    c.ingest(telemetry(1, 1.0, kv=0.3, pods=("p",)))
    batch = c.flush()
    again = pickle.loads(pickle.dumps(batch))
    assert again == batch and dict(again.changed[0].gpus) == dict(batch.changed[0].gpus)


def fed(reports: list[tuple[int, float, dict]], *, batched: bool
        ) -> tuple[TelemetryStore, list[str], list[str], list[str]]:
    """The same reports into a store, one by one (the store sweeping for staleness before each) or
    through a coalescer flushed before and after each (it judges staleness at its flushes)."""
    store = TelemetryStore(stale_after_periods=3.0)
    changes: list[str] = []
    rises: list[str] = []
    stale: list[str] = []
    clock = Clock()
    c = coalescer(clock)

    def took(changed: Changes) -> None:
        changes.extend(changed.judged)
        rises.extend(changed.rose)
        stale.extend(changed.stale)
    for seq, at, kwargs in reports:
        t = telemetry(seq, at, **kwargs)
        clock.now = at
        if batched:
            for batch in (c.flush(), c.ingest(t), c.flush()):
                if isinstance(batch, IngestBatch):
                    took(store.apply(batch))
        else:
            took(store.sweep(at))
            took(store.ingest(t))
    return store, changes, rises, stale


STORY = [(1, 1.0, {}), (2, 2.0, {"free_gib": 40.7}), (3, 3.0, {"foreign_gib": 20}), (4, 4.0, {"foreign_gib": 20}),
         (5, 5.0, {}), (6, 20.0, {}), (7, 21.0, {"pods": ("p",)})]


def test_batches_judge_as_reports_one_by_one():
    one, one_changes, one_rises, one_stale = fed(STORY, batched=False)
    batched, changes, rises, stale = fed(STORY, batched=True)
    assert (changes, rises, stale) == (one_changes, one_rises, one_stale)
    assert rises == ["n1", "n1", "n1"], "first report, foreign process gone, back after going stale"
    assert stale == ["n1"], "silent from 5.0 to 20.0: stale once"
    a, b = one.get("n1"), batched.get("n1")
    assert a is not None and b is not None
    assert (b.sequence, b.received_at, b.sampled_at_unix) == (a.sequence, a.received_at, a.sampled_at_unix) == \
        (7, 21.0, pytest.approx(1.7e9))
    assert dict(b.gpus) == dict(a.gpus) and one.actual_assignments("n1") == batched.actual_assignments("n1")
    assert batched.heard("n1") == Heard(21.0, 7, pytest.approx(1.7e9))
    assert batched.reports == one.reports == len(STORY)


def test_the_core_applies_freshness_as_told_by_the_ingest_process():
    store = TelemetryStore(stale_after_periods=3.0)
    store.apply(IngestBatch(changed=(telemetry(1, 1.0),), reports=1))
    assert store.is_fresh("n1") and store.sweep(100.0) == Changes(), "the core does not sweep what it is told"
    told = store.apply(IngestBatch(stale=(("n1", (10.0, 9, 0.0)),)))
    assert told == Changes(stale=("n1",)) and not store.is_fresh("n1")
    assert store.view()["n1"].received_at == 10.0, "a stale node shows its last report's stamps"
    assert store.apply(IngestBatch(stale=(("n1", (10.0, 9, 0.0)),))) == Changes(), "told once"
    back = store.apply(IngestBatch(back=(("n1", 30.0, 12, 0.0),), reports=1))
    assert back == Changes(rose=("n1",)) and store.is_fresh("n1")


@pytest.mark.parametrize("batch", [
    pytest.param(IngestBatch(back=(("ghost", 1.0, 1, 0.0),), reports=1), id="back"),
    pytest.param(IngestBatch(stale=(("ghost", (1.0, 1, 0.0)),)), id="stale"),
])
def test_news_of_a_node_never_seen_whole_is_ignored(batch):
    store = TelemetryStore()
    assert store.apply(batch) == Changes()
    assert store.get("ghost") is None and len(store) == 0


def test_the_ingest_process_tells_each_transition_once_and_nothing_in_between():
    clock = Clock(1.0)
    c = coalescer(clock)
    c.ingest(telemetry(1, 1.0, node="a"))
    c.ingest(telemetry(1, 1.0, node="b"))
    assert c.flush() is not None
    for second in (2.0, 3.0, 4.0):  # a reports unchanged every period, b is silent
        clock.now = second
        c.ingest(telemetry(int(second), second, node="a"))
        assert c.flush() in (None, IngestBatch(reports=1)), "nothing but the count while nothing changes"
    clock.now = 4.5
    c.ingest(telemetry(5, 4.5, node="a"))
    batch = c.flush()
    assert batch is not None and batch.stale == (("b", (1.0, 1, pytest.approx(1.7e9))),), "b: 3 periods silent"
    clock.now = 5.0
    assert c.flush() is None, "told once"
    c.ingest(telemetry(2, 5.0, node="b"))
    batch = c.flush()
    assert batch is not None and batch.back == (("b", 5.0, 2, pytest.approx(1.7e9)),) and batch.changed == ()


def test_a_new_ingest_process_lets_seeded_nodes_go_stale_unless_they_report():
    clock = Clock(100.0)
    c = coalescer(clock)
    c.seed((("silent", 1.0, (90.0, 7, 0.0)), ("talks", 1.0, (90.0, 3, 0.0))))
    clock.now = 102.5
    c.ingest(telemetry(4, 102.5, node="talks"))
    assert all(not b.stale for b in [c.flush()] if b is not None), "each has its allowance from the seed"
    clock.now = 103.5
    c.ingest(telemetry(5, 103.5, node="talks"))
    batch = c.flush()
    assert batch is not None and batch.stale == (("silent", (90.0, 7, 0.0)),)


def cluster() -> tuple[ClusterState, TelemetryStore]:
    store = TelemetryStore(clock=lambda: 2.0)
    state = ClusterState(clock=lambda: 2.0, telemetry=store)
    state.nodes.replace([make_k8s_node(n, h100_inventory(n)) for n in ("n1", "n2", "n3")])
    state.snapshot()
    return state, store


def test_a_batch_is_laid_into_the_snapshot_in_one_step_before_the_next_decision():
    state, _ = cluster()
    c = coalescer()
    for node in ("n1", "n2"):
        c.ingest(telemetry(1, 1.5, node=node, foreign_gib=20))
    generation = state.snapshot().generation
    state.apply_telemetry(c.flush())  # type: ignore[arg-type]
    assert state.layout_pending is False, "re-laid by apply_telemetry, not left to the next decision"
    snapshot = state.snapshot()
    assert snapshot.generation == generation + 1, "one re-layout for the whole batch"
    assert state.foreign_nodes() == {"n1", "n2"}


def test_a_node_gone_stale_is_laid_again_on_the_stale_assumption():
    state, store = cluster()
    c = coalescer()
    c.ingest(telemetry(1, 1.5, node="n1"))
    state.apply_telemetry(c.flush())  # type: ignore[arg-type]
    generation = state.snapshot().generation
    c.ingest(telemetry(2, 1.9, node="n1", free_gib=40.8))
    assert c.flush() is None, "an unchanged report does not reach the core"
    state.apply_telemetry(IngestBatch(stale=(("n1", (1.9, 2, 0.0)),)))
    assert state.snapshot().generation == generation + 1 and not store.is_fresh("n1")


@pytest.mark.parametrize("pods,gone", [
    pytest.param([("ns/p", "n1")], frozenset(), id="runs-there"),
    pytest.param([("ns/p", "n2")], {("ns/p", "n2")}, id="runs-elsewhere"),
    pytest.param([("ns/q", "n1")], {("ns/q", "n1")}, id="unknown-pod"),
])
def test_pods_gone_names_streams_whose_pod_left_its_node(pods, gone):
    state, _ = cluster()
    state.pods.replace([{"metadata": {"namespace": "ns", "name": "p", "uid": "u"}, "spec": {"nodeName": "n1"},
                         "status": {"phase": "Running"}}])
    assert state.pods_gone(pods) == gone
