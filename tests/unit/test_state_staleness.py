"""A node's telemetry going stale and coming back, as the decision core lays the node out (issue 22:
a partitioned agent). What a pod retried at the moment the node reports again must see is the
node judged fresh — the capacity-rise listeners (the requeue nudges) run right then, while the
staleness sweep that would otherwise re-lay the node runs only every 0.5 s."""

from __future__ import annotations

from extender.model.telemetry import GpuSample, NodeTelemetry
from extender.service.state import ClusterState, StateListeners, TelemetryReconciler
from extender.service.telemetry import TelemetryStore
from tests.unit.builders import H100_MIB, h100_inventory, make_k8s_node

GIB = 1 << 30


def report(seq: int, at: float) -> NodeTelemetry:
    """Node ``a``'s 8 H100s, all free, period 1 s, received at ``at``."""
    gpus = {f"GPU-a-{i}": GpuSample(f"GPU-a-{i}", i, H100_MIB << 20, H100_MIB << 20, 0, False, ())
            for i in range(8)}
    return NodeTelemetry("a", seq, at, 1.0, "fake", gpus, ())


def usable_gib(state: ClusterState) -> int:
    """What GPU 0 of node ``a`` offers a new engine in the next decision's snapshot."""
    return (state.snapshot().nodes["a"].units[0].memory_mib or 0) // 1024


def watched_node_a(now: list[float], capacity_rose: list | None = None) -> tuple[ClusterState, TelemetryReconciler]:
    """A state judging node ``a`` (8 H100s) with a telemetry store (3 periods), both on ``now[0]``;
    its reconciler, which takes the reports. ``capacity_rose``: listeners, as the assembly's nudgers."""
    store = TelemetryStore(stale_after_periods=3.0, clock=lambda: now[0])
    state = ClusterState(clock=lambda: now[0], telemetry=store,
                         listeners=StateListeners(capacity_rose=tuple(capacity_rose or ())))
    state.nodes.replace([make_k8s_node("a", h100_inventory("a"))])
    assert state.reconciler is not None
    return state, state.reconciler


def test_a_node_reporting_again_after_going_stale_is_judged_fresh_by_the_next_decision():
    now = [0.0]
    seen_by_retry: list[int] = []
    # Told after the state re-laid the node, as the extender's assembly gives its nudgers.
    state, store = watched_node_a(now, [lambda node: seen_by_retry.append(usable_gib(state))])
    store.ingest(report(1, 0.0))
    assert usable_gib(state) == 79  # fresh: what NVML says is free, in whole GiB
    seen_by_retry.clear()  # the first report is a capacity rise too

    now[0] = 5.0  # no report for 5 periods (the link is down)
    state.sweep_staleness()
    assert usable_gib(state) == 71  # stale: at most 90 % of the GPU

    now[0] = 5.1
    store.ingest(report(2, 5.1))  # the same content: the judged value did not change, only its age
    assert seen_by_retry == [79], "a pod retried now would be judged on the stale assumption"
    assert usable_gib(state) == 79


def test_a_decisions_telemetry_note_says_what_its_verdicts_were_judged_on():
    """Between a report ageing past 3 periods and the next sweep the node is still laid out fresh;
    the record's note must say so too, never STALE beside a verdict judged on fresh numbers (the
    partition test saw a 75 GiB pod judged to fit a node whose record said STALE)."""
    now = [0.0]
    state, store = watched_node_a(now)
    store.ingest(report(1, 0.0))
    state.sweep_staleness()

    now[0] = 3.4  # older than 3 periods, not yet swept
    assert (usable_gib(state), state.telemetry_note("a")[0].split()[0]) == (79, "fresh")
    state.sweep_staleness()
    assert (usable_gib(state), state.telemetry_note("a")[0].split()[0]) == (71, "STALE")
    now[0] = 3.5
    store.ingest(report(2, 3.5))  # back: laid fresh at once, and said so at once
    assert (usable_gib(state), state.telemetry_note("a")[0].split()[0]) == (79, "fresh")
