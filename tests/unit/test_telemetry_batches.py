"""Issue 18: the ingest process coalesces reports into batches, and the core applies a batch in one
step. A batch carries a node's whole value only when what is judged changed; every other node that
reported moves on only in when it was heard from — and the store, the snapshot, the staleness sweep
and the capacity-rise hook see the same as when every report was ingested one by one."""

from __future__ import annotations

import pickle

import pytest

from extender.adapters.telemetry_server import report_to_telemetry
from extender.service.ingest_batch import Coalescer, IngestBatch
from extender.service.state import ClusterState
from extender.service.telemetry import Heard, TelemetryStore
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


@pytest.mark.parametrize("second,whole", [
    pytest.param(dict(free_gib=40.6), False, id="jitter-inside-the-GiB"),
    pytest.param(dict(free_gib=30.5), True, id="free-memory-crosses-a-GiB"),
    pytest.param(dict(foreign_gib=20), True, id="foreign-process"),
    pytest.param(dict(pods=("p",)), True, id="kubelet-assignment"),
    pytest.param(dict(kv=0.9), True, id="engine-headroom"),
])
def test_a_node_is_shipped_whole_only_when_what_is_judged_changed(second, whole):
    c = Coalescer()
    c.ingest(telemetry(1, 1.0))
    first = c.flush()
    assert first is not None and [r.node for r in first.changed] == ["n1"] and first.heard == ()
    c.ingest(telemetry(2, 2.0, **second))
    batch = c.flush()
    assert batch is not None and batch.reports == 1
    if whole:
        assert [r.sequence for r in batch.changed] == [2] and batch.heard == ()
    else:
        assert batch.changed == () and batch.heard == (("n1", 2.0, 2, pytest.approx(1.7e9)),)


def test_only_the_newest_report_per_node_reaches_the_batch():
    c = Coalescer()
    for seq in range(1, 6):
        c.ingest(telemetry(seq, float(seq), node="a"))
    c.ingest(telemetry(1, 1.5, node="b"))
    batch = c.flush()
    assert batch is not None and batch.reports == 6
    assert sorted((r.node, r.sequence) for r in batch.changed) == [("a", 5), ("b", 1)]
    assert c.flush() is None, "nothing since: no batch"


def test_a_change_that_reverts_within_one_interval_is_not_shipped():
    c = Coalescer()
    c.ingest(telemetry(1, 1.0))
    c.flush()
    c.ingest(telemetry(2, 2.0, foreign_gib=20))
    c.ingest(telemetry(3, 3.0))
    batch = c.flush()
    assert batch is not None and batch.changed == () and [h[2] for h in batch.heard] == [3]


def test_streams_opened_and_closed_travel_with_the_batch():
    c = Coalescer()
    c.stream_opened(("gpusched-system/agent-a", "a"))
    c.stream_closed(("gpusched-system/agent-a", "a"))
    batch = c.flush()
    assert batch is not None and batch.opened == batch.closed == (("gpusched-system/agent-a", "a"),)
    assert c.flush() is None


def test_a_batch_pickles_with_its_whole_values():
    c = Coalescer()
    c.ingest(telemetry(1, 1.0, kv=0.3, pods=("p",)))
    batch = c.flush()
    again = pickle.loads(pickle.dumps(batch))
    assert again == batch and dict(again.changed[0].gpus) == dict(batch.changed[0].gpus)


def fed(reports: list[tuple[int, float, dict]], *, batched: bool) -> tuple[TelemetryStore, list[str], list[str]]:
    """The same reports into a store, one by one or through a coalescer flushed after each."""
    store = TelemetryStore(stale_after_periods=3.0)
    changes: list[str] = []
    rises: list[str] = []
    c = Coalescer()
    for seq, at, kwargs in reports:
        t = telemetry(seq, at, **kwargs)
        if batched:
            c.ingest(t)
            changed = store.apply(c.flush())  # type: ignore[arg-type]
        else:
            changed = store.ingest(t)
        changes += changed.judged
        rises += changed.rose
    return store, changes, rises


STORY = [(1, 1.0, {}), (2, 2.0, {"free_gib": 40.7}), (3, 3.0, {"foreign_gib": 20}), (4, 4.0, {"foreign_gib": 20}),
         (5, 5.0, {}), (6, 20.0, {}), (7, 21.0, {"pods": ("p",)})]


def test_batches_judge_as_reports_one_by_one():
    one, one_changes, one_rises = fed(STORY, batched=False)
    batched, changes, rises = fed(STORY, batched=True)
    assert (changes, rises) == (one_changes, one_rises)
    assert rises == ["n1", "n1", "n1"], "first report, foreign process gone, back after going stale"
    a, b = one.get("n1"), batched.get("n1")
    assert a is not None and b is not None
    assert (b.sequence, b.received_at, b.sampled_at_unix) == (a.sequence, a.received_at, a.sampled_at_unix) == \
        (7, 21.0, pytest.approx(1.7e9))
    assert dict(b.gpus) == dict(a.gpus) and one.actual_assignments("n1") == batched.actual_assignments("n1")
    assert batched.heard("n1") == Heard(21.0, 7, pytest.approx(1.7e9))
    assert batched.reports == one.reports == len(STORY)


def test_freshness_follows_when_a_node_was_heard_not_when_it_changed():
    store = TelemetryStore(stale_after_periods=3.0)
    store.apply(IngestBatch(changed=(telemetry(1, 1.0),), reports=1))
    store.apply(IngestBatch(heard=(("n1", 10.0, 9, 0.0),), reports=1))
    assert store.freshness(12.0) == {"n1": True}
    assert store.freshness(14.0) == {"n1": False}
    assert store.view()["n1"].received_at == 10.0


def test_heard_about_a_node_never_seen_whole_is_ignored():
    store = TelemetryStore()
    store.apply(IngestBatch(heard=(("ghost", 1.0, 1, 0.0),), reports=1))
    assert store.get("ghost") is None and len(store) == 0


def cluster() -> tuple[ClusterState, TelemetryStore]:
    store = TelemetryStore(clock=lambda: 2.0)
    state = ClusterState(clock=lambda: 2.0, telemetry=store)
    state.nodes.replace([make_k8s_node(n, h100_inventory(n)) for n in ("n1", "n2", "n3")])
    state.snapshot()
    return state, store


def test_a_batch_is_laid_into_the_snapshot_in_one_step_before_the_next_decision():
    state, _ = cluster()
    c = Coalescer()
    for node in ("n1", "n2"):
        c.ingest(telemetry(1, 1.5, node=node, foreign_gib=20))
    generation = state.snapshot().generation
    state.apply_telemetry(c.flush())  # type: ignore[arg-type]
    assert state.layout_pending is False, "re-laid by apply_telemetry, not left to the next decision"
    snapshot = state.snapshot()
    assert snapshot.generation == generation + 1, "one re-layout for the whole batch"
    assert state.foreign_nodes() == {"n1", "n2"}


def test_a_batch_of_heard_nodes_does_not_touch_the_snapshot():
    state, _ = cluster()
    c = Coalescer()
    c.ingest(telemetry(1, 1.5, node="n1"))
    state.apply_telemetry(c.flush())  # type: ignore[arg-type]
    generation = state.snapshot().generation
    c.ingest(telemetry(2, 1.9, node="n1", free_gib=40.8))
    state.apply_telemetry(c.flush())  # type: ignore[arg-type]
    assert state.snapshot().generation == generation


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
