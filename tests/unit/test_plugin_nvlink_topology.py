import pytest

from extender.framework.interfaces import CycleState
from extender.framework.status import Code
from extender.model.ledger import GpuLedger
from extender.model.snapshot import node_info_from_k8s
from extender.plugins.nvlink_topology import NvlinkTopology, NvlinkTopologyArgs
from tests.unit.builders import make_demand, make_fleet, make_k8s_node, make_snapshot

LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"
REQUIRE = {"gpusched.io/require-nvlink": "true"}
GFD = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559"}


def node_of(kind):
    if kind == "gfd":
        return node_info_from_k8s(make_k8s_node("gfd", allocatable=8, labels=GFD))
    return make_fleet(kind)[0]


def run(kind, args=NvlinkTopologyArgs(), held=(), **kwargs):
    node = node_of(kind)
    ledger = GpuLedger()
    if held:
        ledger.observe("ns/o", node.name, held)
    demand = make_demand(**kwargs)
    state = CycleState(make_snapshot([node], ledger.view()), demand)
    plugin = NvlinkTopology(args)
    assert plugin.pre_filter(state, demand).is_success
    return plugin.filter(state, demand, node), plugin.score(state, demand, node)


@pytest.mark.parametrize(("kind", "args", "held", "kwargs", "code", "reason"), [
    ("h100", NvlinkTopologyArgs(), (), {"gpus": 4, "tp": 4, "model": LLAMA70, "annotations": REQUIRE}, Code.SUCCESS, ""),
    ("a100", NvlinkTopologyArgs(), (), {"gpus": 4, "tp": 4, "model": LLAMA70, "annotations": REQUIRE},
     Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "largest NVLink island has 2 suitable GPUs; pod needs 4 on one island"),
    ("l40s", NvlinkTopologyArgs(), (), {"gpus": 2, "tp": 2, "model": LLAMA70, "annotations": REQUIRE},
     Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "no NVLink between GPUs (PCIe only); pod requires NVLink for 2 GPUs"),
    ("gfd", NvlinkTopologyArgs(), (), {"gpus": 2, "tp": 2, "model": LLAMA70, "annotations": REQUIRE},
     Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "GPU topology unknown"),
    ("h100", NvlinkTopologyArgs(), tuple(f"GPU-h100-{i}" for i in (0, 2, 4, 6, 7)),
     {"gpus": 4, "tp": 4, "model": LLAMA70, "annotations": REQUIRE},
     Code.UNSCHEDULABLE, "no NVLink island with 4 free GPUs (largest free island: 3)"),
    ("l40s", NvlinkTopologyArgs(require_nvlink=True), (), {"gpus": 2, "tp": 2, "model": LLAMA70},
     Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "no NVLink between GPUs"),
    ("l40s", NvlinkTopologyArgs(require_nvlink=True), (),
     {"gpus": 2, "tp": 2, "model": LLAMA70, "annotations": {"gpusched.io/require-nvlink": "false"}}, Code.SUCCESS, ""),
    ("l40s", NvlinkTopologyArgs(), (), {"gpus": 2, "tp": 2, "model": LLAMA70}, Code.SUCCESS, ""),
    ("l40s", NvlinkTopologyArgs(require_nvlink=True), (), {"gpus": 1}, Code.SUCCESS, ""),
], ids=["h100-required", "a100-islands-too-small", "l40s-pcie-only", "topology-unknown", "h100-busy",
        "profile-requires", "annotation-opts-out", "not-required", "single-gpu-never-needs-nvlink"])
def test_nvlink_filter(kind, args, held, kwargs, code, reason) -> None:
    status, _ = run(kind, args, held, **kwargs)
    assert status.code is code, status
    assert reason in status.reason


@pytest.mark.parametrize(("kind", "held", "gpus", "score"), [
    ("h100", (), 4, 100),
    ("l40s", (), 2, 60),
    ("l40s", (), 4, 30),
    ("l40s", tuple(f"GPU-l40s-{i}" for i in (0, 1, 2, 4, 5, 6)), 2, 0),
    ("h100", (), 1, 100),
    ("mig", (), 2, 0),
], ids=["nvlink", "pcie-switch", "numa", "cross-socket", "single", "no-placement"])
def test_nvlink_score_by_tier(kind, held, gpus, score) -> None:
    kwargs = {"gpus": gpus} if gpus == 1 else {"gpus": gpus, "tp": gpus, "model": LLAMA70}
    assert run(kind, NvlinkTopologyArgs(), held, **kwargs)[1] == score


def a100_with_foreign_memory_on(lowered: tuple[int, ...], left_gib: int):
    """The a100 node (islands 0-1, 2-3) as ``ClusterState`` lays it out when telemetry says the GPUs
    ``lowered`` have only ``left_gib`` free (foreign processes hold the rest)."""
    from dataclasses import replace

    from extender.model.snapshot import make_node_info
    from tests.unit.builders import a100_inventory

    inventory = a100_inventory("a100")
    static = {g.uuid: g.memory_mib for g in inventory.gpus}
    gpus = tuple(replace(g, memory_mib=left_gib * 1024) if g.index in lowered else g for g in inventory.gpus)
    return make_node_info("a100", replace(inventory, gpus=gpus), static_memory=static)


@pytest.mark.parametrize(("lowered", "need", "code", "reason"), [
    ((0, 2), "30Gi", Code.UNSCHEDULABLE,
     "largest NVLink island has 1 suitable GPUs; pod needs 2 on one island now (as telemetry judges their memory; "
     "2 by the inventory)"),
    ((0, 2), "45Gi", Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "largest NVLink island has 0 suitable GPUs"),
    ((0,), "30Gi", Code.SUCCESS, ""),
], ids=["foreign-memory-splits-both-islands-not-now", "bigger-than-the-inventory-never", "one-island-left-whole"])
def test_an_island_short_of_memory_only_as_telemetry_judges_it_is_not_now_not_never(lowered, need, code,
                                                                                     reason) -> None:
    """The foreign processes exit and the island is whole again: the pod must be retried then, so
    the verdict is "not now" (as GpuFit's for the same memory); only the inventory makes "never"."""
    node = a100_with_foreign_memory_on(lowered, 10)
    demand = make_demand(gpus=2, tp=2, model=LLAMA70, annotations={**REQUIRE, "gpusched.io/gpu-memory-per-gpu": need})
    state = CycleState(make_snapshot([node], GpuLedger().view()), demand)
    plugin = NvlinkTopology(NvlinkTopologyArgs())
    assert plugin.pre_filter(state, demand).is_success
    status = plugin.filter(state, demand, node)
    assert status.code is code, status
    assert reason in status.reason, status.reason
    if code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
        assert "telemetry" not in status.reason
