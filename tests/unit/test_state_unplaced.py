"""A GPU pod gpusched did not place holds, in the ledger, the units gpusched's device plugin gives it
(``gpusched_api.unit_choice.choose_unplaced``, judged with the node's telemetry) until the node
reports which the kubelet gave (issue 44).

Before, the ledger took the lowest free units: on an A100 node with pairs (0,1) and (2,3) and a
leftover process on GPU 2, a stock pod got GPU 3 from the device plugin while the ledger said GPU 0,
so pair (0,1) looked broken and a TP=2 pod that requires NVLink was promised pair (2,3) — GPU 3
twice — until the node's next report corrected the ledger (seen once in CI under load)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from extender.model.snapshot import GpuUnit
from extender.model.telemetry import GpuSample, NodeTelemetry
from extender.service.state import ClusterState
from extender.service.telemetry import TelemetryStore
from gpusched_api.inventory import NodeGpuInventory
from nodeagent.deviceplugin.allocation import Unit, prefer
from tests.unit.builders import a100_inventory, h100_inventory, make_k8s_node, make_pod

GIB = 1 << 30
A100 = ("a100", a100_inventory)
H100 = ("h100", h100_inventory)


def bound(name: str, node: str, gpus: int, assigned: str = "") -> dict:
    pod = make_pod(name, "ns", gpus=gpus, annotations={"gpusched.io/assigned-gpus": assigned} if assigned else None)
    pod["spec"]["nodeName"] = node
    return pod


def leftover_report(node: str, gpus: int, dirty: dict[int, int]) -> NodeTelemetry:
    """A fresh report of ``gpus`` GPUs of ``node``, GPU i holding ``dirty[i]`` GiB of a process outside any pod."""
    samples = {f"GPU-{node}-{i}": GpuSample(f"GPU-{node}-{i}", i, 40 * GIB, (40 - dirty.get(i, 0)) * GIB,
                                            foreign_used_bytes=dirty.get(i, 0) * GIB)
               for i in range(gpus)}
    return NodeTelemetry(node, 1, 0.0, 1.0, "fake", samples, ())


def cluster(kind: tuple[str, Callable[[str], NodeGpuInventory]], dirty: dict[int, int]) -> ClusterState:
    name, inventory_of = kind
    inventory = inventory_of(name)
    state = ClusterState(telemetry=TelemetryStore())
    state.nodes.replace([make_k8s_node(name, inventory)])
    if dirty:
        state.ingest_telemetry(leftover_report(name, len(inventory.gpus), dirty))
    return state


def as_device_plugin_unit(u: GpuUnit) -> Unit:
    """The device plugin's view of the core's unit (as ``nodeagent.deviceplugin.allocation.units_of`` builds it)."""
    return Unit(u.id, u.gpu_index, u.numa_node, u.island, u.is_mig, u.failure, 30 * GIB if u.foreign else 0,
                position=u.position, pcie_switch=u.pcie_switch, memory_mib=u.memory_mib)


@pytest.mark.parametrize("kind,dirty,before,count,expected", [
    pytest.param(A100, {2: 30}, (), 1, {3}, id="a-leftover-broke-pair-2-3-the-stock-pod-takes-gpu-3"),
    pytest.param(A100, {}, (), 1, {0}, id="clean-pairs-lowest-position"),
    pytest.param(A100, {}, ((1, "GPU-a100-0"),), 1, {1}, id="the-broken-pairs-partner-before-a-whole-pair"),
    pytest.param(A100, {}, ((1, "GPU-a100-0"),), 2, {2, 3}, id="a-pair-takes-the-whole-pair"),
    pytest.param(A100, {0: 30, 1: 30}, (), 1, {2}, id="clean-before-dirty"),
    pytest.param(H100, {}, ((1, "GPU-h100-0"),), 1, {1}, id="h100-the-switch-already-broken"),
    pytest.param(H100, {}, ((2, "GPU-h100-0,GPU-h100-1"),), 4, {2, 3, 4, 5}, id="h100-four-pack-the-broken-switches-first"),
])
def test_a_pod_another_scheduler_placed_holds_what_the_device_plugin_gives_it(kind, dirty, before, count, expected):
    name, _ = kind
    state = cluster(kind, dirty)
    for i, (gpus, assigned) in enumerate(before):
        state.pods.apply("ADDED", bound(f"gpusched-{i}", name, gpus, assigned))
    free_before = state.snapshot().free_units(state.snapshot().nodes[name])
    state.pods.apply("ADDED", bound("stock", name, count))
    held = state.ledger.assignment("ns/stock")
    assert held is not None and held.unit_ids == {f"GPU-{name}-{i}" for i in expected}
    # One rule: the node's device plugin, offered the same free units, answers the same.
    units = [as_device_plugin_unit(u) for u in free_before.whole + free_before.mig]
    answer = prefer([u.id for u in units], [], count, [], units)
    assert set(answer.units) == held.unit_ids, answer.reason


def test_after_the_stock_pod_the_clean_pair_is_still_whole_for_a_pair_that_requires_nvlink():
    state = cluster(A100, {2: 30})
    state.pods.apply("ADDED", bound("stock", "a100", 1))
    snapshot = state.snapshot()
    free = snapshot.free_units(snapshot.nodes["a100"])
    assert {u.id for u in free.whole} == {"GPU-a100-0", "GPU-a100-1", "GPU-a100-2"}
    assert not any(u.foreign for u in free.whole if u.id in ("GPU-a100-0", "GPU-a100-1"))
