import pytest

from extender.framework.interfaces import CycleState
from extender.framework.status import Code
from extender.model.demand import PodDemand
from extender.model.ledger import GpuLedger
from extender.model.snapshot import node_info_from_k8s
from extender.plugins.gpu_fit import GpuFit, GpuFitArgs
from tests.unit.builders import make_demand, make_fleet, make_k8s_node, make_snapshot

LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"


def run(kind, held=(), **demand_kwargs):
    node = make_fleet(kind)[0] if kind != "bare" else node_info_from_k8s(make_k8s_node("bare", allocatable=2))
    ledger = GpuLedger()
    if held:
        ledger.observe("ns/o", node.name, held)
    demand = make_demand(**demand_kwargs)
    state = CycleState(make_snapshot([node], ledger.view()), demand)
    return GpuFit(GpuFitArgs()).filter(state, demand, node)


MEM = "gpusched.io/gpu-memory-per-gpu"


@pytest.mark.parametrize(("kind", "held", "kwargs", "code", "reason"), [
    ("h100", (), {"gpus": 8}, Code.SUCCESS, ""),
    ("h100", (), {"gpus": 0}, Code.SUCCESS, ""),
    ("a100", (), {"gpus": 8}, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "node advertises 4 nvidia.com/gpu; pod needs 8"),
    ("a100", ("GPU-a100-0", "GPU-a100-1", "GPU-a100-2"), {"gpus": 2, "model": LLAMA70, "tp": 2},
     Code.UNSCHEDULABLE, "only 1 of 4 GPUs free; pod needs 2"),
    ("a100", (), {"gpus": 2, "model": LLAMA70, "tp": 2, "annotations": {MEM: "60Gi"}},
     Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "GPUs 0,1,2,3 have 40.0 GiB < 60.0 GiB needed per GPU"),
    ("l40s", (), {"gpus": 1, "annotations": {MEM: "45Gi"}},
     Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "have 46068 MiB < 46080 MiB needed per GPU"),
    ("h100", tuple(f"GPU-h100-{i}" for i in range(7)), {"gpus": 2, "annotations": {MEM: "40Gi"}},
     Code.UNSCHEDULABLE, "only 1 of 8 GPUs with 40.0 GiB free; pod needs 2"),
    ("mig", (), {"gpus": 1, "annotations": {MEM: "45Gi"}},
     Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "GPUs 0(3g.40gb),0(2g.20gb),0(2g.20gb) have at most 39.2 GiB"),
    ("mig", ("MIG-mig-0-0", "MIG-mig-0-1", "MIG-mig-0-2"), {"gpus": 1},
     Code.UNSCHEDULABLE, "only 0 of 3 GPUs free; pod needs 1"),
    ("bare", (), {"gpus": 1, "annotations": {MEM: "1Gi"}},
     Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "GPU memory unknown on this node"),
    ("bare", (), {"gpus": 2}, Code.SUCCESS, ""),
], ids=["fits-all", "no-gpus", "too-few-on-node", "busy", "too-little-memory", "memory-close-call",
        "busy-with-memory", "mig-too-small", "mig-all-held", "memory-unknown", "allocatable-only"])
def test_gpu_fit(kind, held, kwargs, code, reason) -> None:
    status = run(kind, held, **kwargs)
    assert status.code is code, status
    assert reason in status.reason and status.plugin == "GpuFit"


def lowered_by_telemetry(kind: str, effective_mib: int):
    """A ``kind`` node whose every unit telemetry judges to have at most ``effective_mib`` usable
    (foreign processes, or stale telemetry's assumption), as ``ClusterState`` lays it out."""
    from dataclasses import replace

    from extender.model.snapshot import make_node_info
    from tests.unit.builders import FLEET_INVENTORIES

    inventory = FLEET_INVENTORIES[kind](kind)
    static = {g.uuid: g.memory_mib for g in inventory.gpus} | {
        i.uuid: i.memory_mib for g in inventory.gpus for i in g.mig_instances}
    gpus = tuple(replace(g, memory_mib=min(g.memory_mib, effective_mib), mig_instances=tuple(
        replace(i, memory_mib=min(i.memory_mib, effective_mib)) for i in g.mig_instances)) for g in inventory.gpus)
    return make_node_info(kind, replace(inventory, gpus=gpus), static_memory=static)


@pytest.mark.parametrize(("kind", "effective_gib", "need", "code", "reason"), [
    ("h100", 71, "75Gi", Code.UNSCHEDULABLE,
     "GPUs 0,1,2,3,4,5,6,7 have 71.0 GiB < 75.0 GiB needed per GPU now (as telemetry judges them; 79.6 GiB by the "
     "inventory)"),
    ("h100", 71, "90Gi", Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "have 71.0 GiB < 90.0 GiB needed per GPU"),
    ("h100", 71, "70Gi", Code.SUCCESS, ""),
    ("mig", 30, "35Gi", Code.UNSCHEDULABLE, "now (as telemetry judges them; up to 39.2 GiB by the inventory)"),
    ("mig", 30, "45Gi", Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "have at most 30.0 GiB < 45.0 GiB"),
], ids=["stale-or-foreign-not-now", "too-big-for-the-inventory", "fits-what-is-left", "mig-not-now", "mig-never"])
def test_memory_that_telemetry_took_is_not_now_not_never(kind, effective_gib, need, code, reason) -> None:
    """What telemetry lowered can come back (the process exits, the agent reports again): the pod
    must be retried then, so the verdict is "not now"; only the inventory's sizes make "never"."""
    node = lowered_by_telemetry(kind, effective_gib * 1024)
    demand = make_demand(gpus=1, annotations={MEM: need})
    assert isinstance(demand, PodDemand), demand
    status = GpuFit(GpuFitArgs()).filter(CycleState(make_snapshot([node], GpuLedger().view()), demand), demand, node)
    assert status.code is code, status
    assert reason in status.reason, status.reason
    if code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
        assert "telemetry" not in status.reason
