"""A node's report of who holds its devices may speak only for its own pods and its own units
(issue 14, S1): a compromised node must not move another node's pods in the ledger and free
their GPUs for a second promise."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from extender.model.telemetry import GpuSample, NodeTelemetry
from extender.service.state import ClusterState, StateListeners
from extender.service.telemetry import TelemetryStore
from tests.unit.builders import h100_inventory, make_k8s_node, make_pod


def bound_pod(name: str, node: str, gpus: str = "") -> dict:
    pod = make_pod(name, "ns", gpus=1, annotations={"gpusched.io/assigned-gpus": gpus} if gpus else None)
    pod["spec"]["nodeName"] = node
    return pod


def report(node: str, holders: dict[str, tuple[str, ...]]) -> NodeTelemetry:
    """A report whose GPUs name ``holders`` (pod key -> device UUIDs)."""
    by_device: dict[str, list[str]] = {}
    for pod, devices in holders.items():
        for d in devices:
            by_device.setdefault(d, []).append(pod)
    gpus = {d: GpuSample(d, i, 80 << 30, 40 << 30, 0, False, tuple(pods)) for i, (d, pods) in enumerate(by_device.items())}
    return NodeTelemetry(node, 1, 0.0, 1.0, "fake", gpus, ())


def watching(**listeners) -> ClusterState:
    state = ClusterState(telemetry=TelemetryStore(), listeners=StateListeners(**listeners))
    state.nodes.replace([make_k8s_node(n, h100_inventory(n)) for n in ("a", "b")])
    state.pods.apply("ADDED", bound_pod("on-a", "a", "GPU-a-0"))
    state.pods.apply("ADDED", bound_pod("on-b", "b", "GPU-b-0"))
    return state


@pytest.fixture
def cluster() -> ClusterState:
    return watching()


@pytest.mark.parametrize("node,holders,reason", [
    pytest.param("a", {"ns/on-b": ("GPU-a-5",)}, "pod-on-other-node", id="a-claims-b's-pod"),
    pytest.param("a", {"ns/on-b": ("GPU-b-0",)}, "pod-on-other-node", id="a-claims-b's-pod-on-b's-gpu"),
    pytest.param("a", {"ns/ghost": ("GPU-a-3",)}, "pod-unknown", id="a-claims-a-pod-nobody-knows"),
    pytest.param("a", {"ns/on-a": ("GPU-b-1",)}, "unit-not-in-inventory", id="a-claims-a-unit-of-b"),
    pytest.param("a", {"ns/on-a": ("GPU-made-up",)}, "unit-not-in-inventory", id="a-claims-a-made-up-unit"),
])
def test_a_report_cannot_speak_for_other_nodes_pods_or_units(cluster, node, holders, reason):
    before = cluster.ledger.view().assignments
    cluster.ingest_telemetry(report(node, holders))
    after = cluster.ledger.view().assignments
    assert after == before, "the ledger moved on a report the node may not make"
    assert cluster.holders_refused[reason] == 1, dict(cluster.holders_refused)
    assert after["ns/on-b"].node == "b" and after["ns/on-b"].unit_ids == frozenset({"GPU-b-0"})


def test_the_kubelets_truth_for_the_nodes_own_pod_and_unit_is_followed(cluster):
    cluster.ingest_telemetry(report("a", {"ns/on-a": ("GPU-a-4",)}))
    assert cluster.ledger.assignment("ns/on-a").unit_ids == frozenset({"GPU-a-4"})
    assert not cluster.holders_refused


def test_a_holder_refused_while_the_watch_lagged_is_accepted_once_the_watch_shows_the_pod(cluster):
    cluster.ingest_telemetry(report("a", {"ns/late": ("GPU-a-6",)}))
    assert cluster.holders_refused["pod-unknown"] == 1
    assert cluster.ledger.assignment("ns/late") is None
    cluster.pods.apply("ADDED", bound_pod("late", "a", "GPU-a-2"))  # the watch catches up
    assert cluster.ledger.assignment("ns/late").unit_ids == frozenset({"GPU-a-6"}), "the kubelet's choice wins"


def test_after_a_deletion_the_node_cannot_keep_claiming_the_pod(cluster):
    cluster.pods.apply("DELETED", bound_pod("on-a", "a", "GPU-a-0"))
    cluster.ingest_telemetry(report("a", {"ns/on-a": ("GPU-a-0",)}))
    assert cluster.ledger.assignment("ns/on-a") is None
    assert cluster.holders_refused["pod-unknown"] == 1


def test_a_container_given_other_devices_than_assigned_is_reported_once_and_the_ledger_follows():
    seen: list[tuple] = []
    cluster = watching(mismatch=(lambda *args: seen.append(args),))
    cluster.ingest_telemetry(report("a", {"ns/on-a": ("GPU-a-0",)}))  # as assigned: nothing to report
    assert seen == []
    cluster.ingest_telemetry(report("a", {"ns/on-a": ("GPU-a-5",)}))
    cluster.ingest_telemetry(report("a", {"ns/on-a": ("GPU-a-5",), "ns/other": ()}))  # same set again: once
    assert seen == [("ns/on-a", "a", ("GPU-a-0",), ("GPU-a-5",))] and cluster.assignment_mismatches == 1
    assert cluster.ledger.assignment("ns/on-a").unit_ids == frozenset({"GPU-a-5"})


def ghosts(n: int, per_unit: int = 8) -> NodeTelemetry:
    """Report ``n`` of node a: each of its 8 GPUs held by ``per_unit`` pods named nowhere before."""
    gpus = {f"GPU-a-{i}": GpuSample(f"GPU-a-{i}", i, 80 << 30, 40 << 30, 0, False,
                                    tuple(f"ns/ghost-{n}-{i}-{k}" for k in range(per_unit))) for i in range(8)}
    return NodeTelemetry("a", n, 0.0, 1.0, "fake", gpus, ())


def test_reports_naming_fresh_holders_leave_the_cores_memory_flat(cluster):
    """Issue 39, M3: every unknown holder name was remembered forever (40 reports kept 30 MiB). Only
    the latest report's unknown holders are kept, so 1,000 reports of fresh names cost what one does."""
    tracemalloc.start()
    try:
        for n in range(1, 101):
            cluster.ingest_telemetry(ghosts(n))
        warm, _ = tracemalloc.get_traced_memory()
        for n in range(101, 1_001):
            cluster.ingest_telemetry(ghosts(n))
        grown = tracemalloc.get_traced_memory()[0] - warm
    finally:
        tracemalloc.stop()
    assert cluster.holders_refused["pod-unknown"] == 1_000 * 64, "every report's ghosts were judged"
    # Kept for good, the 57,600 names of the last 900 reports are ~6 MiB.
    assert grown < 256 * 1024, f"900 more reports of fresh holder names kept {grown / 1024:.0f} KiB"
    assert cluster.ledger.assignment("ns/on-a").unit_ids == frozenset({"GPU-a-0"})


# ---- issue 22: a node claiming more than its inventory ----------------------------------------------
H100_SIZE_MIB = h100_inventory("a").gpus[0].memory_mib


def claim(units: dict[str, int]) -> NodeTelemetry:
    """A fresh report of node a whose units (uuid -> free MiB) are all 80 GiB GPUs."""
    gpus = {u: GpuSample(u, i, 80 << 30, free << 20) for i, (u, free) in enumerate(units.items())}
    return NodeTelemetry("a", 1, time.monotonic(), 1.0, "fake", gpus, ())


def honest(**overrides: int) -> dict[str, int]:
    """Node a's eight GPUs with 40 GiB free each; ``overrides``: GPU index (as ``g<i>``) -> free MiB."""
    return {f"GPU-a-{i}": overrides.get(f"g{i}", 40 * 1024) for i in range(8)}


@pytest.mark.parametrize("units,counts,free_mib", [
    pytest.param(honest(), {}, [40 * 1024] * 8, id="honest"),
    pytest.param(honest() | {f"GPU-a-{i}": 80 * 1024 for i in range(8, 64)}, {"unit-not-in-inventory": 56},
                 [40 * 1024] * 8, id="64-gpus-on-an-8-gpu-node"),
    pytest.param(honest(g0=10 * H100_SIZE_MIB, g1=H100_SIZE_MIB), {"memory-over-inventory": 1},
                 [H100_SIZE_MIB // 1024 * 1024] * 2 + [40 * 1024] * 6, id="ten-times-a-gpus-memory"),
    pytest.param(honest() | {"GPU-b-0": 80 * 1024}, {"unit-not-in-inventory": 1}, [40 * 1024] * 8,
                 id="another-nodes-gpu"),
])
def test_a_node_claiming_more_than_its_inventory_is_judged_on_its_inventory_and_counted(cluster, units, counts,
                                                                                       free_mib):
    cluster.ingest_telemetry(claim(units))
    node = cluster.snapshot().nodes["a"]
    assert [u.id for u in node.units] == [f"GPU-a-{i}" for i in range(8)], "units came from the report"
    assert [u.memory_mib for u in node.units] == free_mib
    assert dict(cluster.telemetry_clamped) == counts


def test_every_reason_the_state_counts_is_exported():
    """share-not-on-node was counted but missing from the exported reasons (found in issue 22)."""
    from collections import Counter

    from prometheus_client import CollectorRegistry, generate_latest

    from extender.adapters.telemetry_server import count_clamped_claims, count_refused_holders

    registry = CollectorRegistry()
    count_refused_holders(registry, Counter({"share-not-on-node": 2, "pod-unknown": 1}))
    count_clamped_claims(registry, Counter({"memory-over-inventory": 3}))
    text = generate_latest(registry).decode()
    for line in ('gpusched_telemetry_holders_refused_total{reason="share-not-on-node"} 2.0',
                 'gpusched_telemetry_holders_refused_total{reason="pod-unknown"} 1.0',
                 'gpusched_telemetry_clamped_total{reason="memory-over-inventory"} 3.0',
                 'gpusched_telemetry_clamped_total{reason="unit-not-in-inventory"} 0.0'):
        assert line in text, text
