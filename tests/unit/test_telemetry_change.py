"""Issue 41: one definition of "this report changes how its node is judged", shared by the ingest
child (what it ships whole) and the core's store (what it re-lays), and a store that says what
changed instead of calling listeners back. What the key counts is test_telemetry_batches'."""

from __future__ import annotations

import inspect
from types import MappingProxyType

from extender.model.telemetry import EngineSample, GpuSample, NodeTelemetry
from extender.service import ingest_batch, telemetry
from extender.service.ingest_batch import Coalescer
from extender.service.telemetry import Changes, TelemetryStore
from extender.service.telemetry_change import judge

GIB = 1 << 30


def report(seq: int, *, free_gib: float = 40.5, foreign_gib: int = 0, pods: tuple[str, ...] = (),
           kv: float | None = None, at: float = 1.0) -> NodeTelemetry:
    gpu = GpuSample("GPU-0", 0, 80 * GIB, int(free_gib * GIB), foreign_gib * GIB, False, pods)
    engines = (EngineSample("ns/e", "m", kv, 8, 0, 0, 0, ("GPU-0",), False, ""),) if kv is not None else ()
    return NodeTelemetry("n1", seq, at, 1.0, "fake", MappingProxyType({gpu.uuid: gpu}), engines)


def test_the_coalescer_and_the_store_agree_on_every_report():
    """Fed the same reports, the nodes the child ships whole are the nodes the store re-judges."""
    story = [report(1), report(2, free_gib=40.9), report(3, foreign_gib=3), report(4, foreign_gib=3),
             report(5, pods=("ns/p",)), report(6, pods=("ns/p",), kv=0.2), report(7, pods=("ns/p",), kv=0.21)]
    coalescer, store = Coalescer(3.0, clock=lambda: 1.0), TelemetryStore()
    for r in story:
        coalescer.ingest(r)
        batch = coalescer.flush()  # None: nothing to tell the core
        shipped = tuple(t.node for t in batch.changed) if batch is not None else ()
        assert shipped == store.ingest(r).judged, f"report {r.sequence}"


def test_both_processes_judge_with_the_one_definition():
    """Neither module computes a key of its own: both hold a JudgedReports."""
    for module in (ingest_batch, telemetry):
        source = inspect.getsource(module)
        assert "JudgedReports()" in source and "gpu_memory_key" not in source and "engine_headroom" not in source


def test_the_store_reports_changes_and_has_no_listeners():
    store = TelemetryStore(stale_after_periods=3.0)
    assert store.ingest(report(1)) == Changes(("n1",), ("n1",))  # new: judged, and capacity
    assert store.ingest(report(2, at=2.0)) == Changes()
    assert not store.ingest(report(2, at=2.0))  # an empty Changes is falsy
    assert store.sweep(10.0) == Changes(stale=("n1",))
    assert store.ingest(report(3, at=10.0)) == Changes((), ("n1",)), "back after going stale: capacity"
    assert not any(hasattr(store, name) for name in ("on_change", "on_capacity_rise"))


def test_a_report_reusing_the_mapping_reuses_what_it_implies():
    first = report(1)
    again = NodeTelemetry("n1", 2, 2.0, 1.0, "fake", first.gpus, ())
    previous = judge(first, None)
    assert judge(again, previous).derived is previous.derived
