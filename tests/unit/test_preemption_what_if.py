"""Preemption's question (issue 42): the pod judged on a node as it would be with some pods gone
and others placed — ``model.what_if`` (pure), the decider's ``what_if`` (the framework over it),
and the plugin service's rule that a gang member is never counted as preemptible on its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from extender.model.catalog import builtin_catalog
from extender.model.gang import POD_GROUP_LABEL
from extender.model.ledger import Assignment, EntryState, GpuLedger
from extender.model.snapshot import ClusterSnapshot, NodeInfo, make_node_info
from extender.model.what_if import node_what_if
from extender.service.core import ExtenderService, PodRef
from extender.service.decisions import DecisionStore
from extender.service.framework_decider import FrameworkDecider
from extender.service.plugin import FITS, NEVER, NOT_NOW, NodeTables, PluginService
from extender.service.ports import DisabledBinder
from gpusched_api.names import MEMORY_PER_GPU_ANNOTATION
from tests.unit.builders import H100_MIB, NullObserver, default_framework, h100_inventory, make_fleet, make_pod

GIB = 1024


def gpu(node: str, i: int) -> str:
    return f"GPU-{node}-{i}"


def dirty_h100(name: str = "dirty", clean: Sequence[int] = (0, 1)) -> NodeInfo:
    """An 8-GPU H100 node whose GPUs outside ``clean`` hold 70 GiB of foreign memory, as the
    telemetry layout lays it: 10 GiB free each, flagged foreign, shares capped at what is left."""
    inventory = h100_inventory(name)
    gpus = tuple(g if g.index in clean else replace(g, memory_mib=10 * GIB) for g in inventory.gpus)
    foreign = frozenset(g.uuid for g in inventory.gpus if g.index not in clean)
    return make_node_info(name, replace(inventory, gpus=gpus), foreign=foreign,
                          share_capacity={u: 10 * GIB for u in foreign},
                          static_memory={g.uuid: g.memory_mib for g in inventory.gpus})


def engine(name: str, tp: int, *, namespace: str = "default", gang: str = "", memory: str = "") -> PodRef:
    """A TP=``tp`` Llama-3.1-8B engine; ``memory``: the GPU memory it needs per GPU (a quantity)."""
    raw = make_pod(name, namespace, gpus=tp, model="meta-llama/Llama-3.1-8B-Instruct", tp=tp,
                   annotations={MEMORY_PER_GPU_ANNOTATION: memory} if memory else None)
    if gang:
        raw["metadata"]["labels"] = {POD_GROUP_LABEL: gang}
    return PodRef(namespace, name, f"uid-{name}", raw)


def holding(ledger: GpuLedger, pod: PodRef, node: str, indices: Sequence[int]) -> None:
    ledger.observe(pod.key, node, [gpu(node, i) for i in indices], pod.uid)


def decider(nodes: Sequence[NodeInfo]) -> tuple[FrameworkDecider, GpuLedger]:
    ledger = GpuLedger()
    return FrameworkDecider(default_framework(), builtin_catalog(), ledger,
                            lambda: ClusterSnapshot.build(nodes, ledger.view())), ledger


# -- model ---------------------------------------------------------------------------------------

def test_what_if_frees_what_removed_pods_held_and_takes_what_added_pods_hold():
    ledger = GpuLedger()
    node = make_fleet("h100")[0]
    ledger.observe("ns/low-a", "h100", [gpu("h100", i) for i in range(4)], "uid-a")
    ledger.observe("ns/low-b", "h100", [gpu("h100", i) for i in range(4, 8)], "uid-b")
    ledger.observe("ns/elsewhere", "other", ["GPU-other-0"], "uid-e")
    view = ledger.view()
    nominated = Assignment("ns/nominated", "h100", frozenset({gpu("h100", 4)}), EntryState.ASSUMED, "uid-n")
    _, what_if = node_what_if(node, view, [view.assignments["ns/low-b"], view.assignments["ns/elsewhere"]],
                              [nominated])
    assert what_if.held_on("h100") == frozenset(gpu("h100", i) for i in range(5))
    assert what_if.held_on("other") == frozenset()  # only the node asked about
    assert view.held_on("h100") == frozenset(gpu("h100", i) for i in range(8)), "the ledger's view is untouched"


def test_a_removed_sharer_gives_back_its_share_and_the_last_one_frees_the_gpu():
    ledger = GpuLedger()
    node = make_fleet("h100")[0]
    ledger.observe("ns/s1", "h100", [gpu("h100", 0)], "u1", share_mib=20 * GIB)
    ledger.observe("ns/s2", "h100", [gpu("h100", 0)], "u2", share_mib=30 * GIB)
    view = ledger.view()
    _, one_gone = node_what_if(node, view, [view.assignments["ns/s1"]])
    assert one_gone.shares_on("h100") == {gpu("h100", 0): 30 * GIB}
    assert gpu("h100", 0) in one_gone.held_on("h100")
    _, both_gone = node_what_if(node, view, [view.assignments["ns/s1"], view.assignments["ns/s2"]])
    assert both_gone.shares_on("h100") == {} and both_gone.held_on("h100") == frozenset()


def test_a_gpu_freed_by_its_pod_gets_back_the_memory_the_pod_used_but_not_what_foreign_processes_hold():
    node = dirty_h100(clean=())  # every GPU 10 GiB free, 70 GiB of it foreign
    engine_on_0 = replace(node.units[0], memory_mib=2 * GIB, foreign=False, share_capacity_mib=H100_MIB // GIB * GIB)
    node = replace(node, units=(engine_on_0, *node.units[1:]))  # GPU 0: a pod's engine uses 78 GiB of it
    ledger = GpuLedger()
    ledger.observe("ns/low", "dirty", [gpu("dirty", 0), gpu("dirty", 1)], "u")
    view = ledger.view()
    freed, _ = node_what_if(node, view, [view.assignments["ns/low"]])
    assert freed.units[0].memory_mib == H100_MIB // GIB * GIB, "the engine's memory leaves with it"
    assert freed.units[1].memory_mib == 10 * GIB, "foreign memory stays"
    assert freed.shape != node.shape and node.units[0].memory_mib == 2 * GIB


# -- the decider ---------------------------------------------------------------------------------

@pytest.mark.parametrize("removed,added,fits", [
    pytest.param(["low-b"], [], True, id="one TP=4 engine gone frees an island's 4 GPUs"),
    pytest.param([], [], False, id="nothing removed: 0 of 8 free"),
    pytest.param(["low-b"], ["nominated"], False, id="a nominated TP=4 takes the freed GPUs first"),
    pytest.param(["stranger"], [], False, id="a pod holding nothing here frees nothing"),
])
def test_count_blocked_node(removed, added, fits):
    d, ledger = decider(make_fleet("h100"))
    pods = {name: engine(name, 4) for name in ("low-a", "low-b", "nominated", "stranger", "high")}
    holding(ledger, pods["low-a"], "h100", range(4))
    holding(ledger, pods["low-b"], "h100", range(4, 8))
    outcome = d.what_if(pods["high"], "h100", [pods[n] for n in removed], [pods[n] for n in added])
    assert bool(outcome.feasible) is fits, outcome
    if not fits:
        assert "GPUs free" in outcome.failed["h100"]
    assert len(ledger.view().held_on("h100")) == 8, "judging changes nothing in the ledger"


def test_removing_the_pod_on_the_clean_gpus_makes_room_and_removing_nothing_else_does():
    d, ledger = decider([dirty_h100()])
    low, other, high = engine("low", 2), engine("other", 1), engine("high", 2, memory="60Gi")
    holding(ledger, low, "dirty", [0, 1])
    holding(ledger, other, "dirty", [2])
    assert not d.what_if(high, "dirty", [other], []).feasible
    assert d.what_if(high, "dirty", [low], []).feasible == ("dirty",)


def test_a_mig_only_node_never_fits_a_tp_group_whatever_is_removed():
    d, ledger = decider(make_fleet("mig"))
    small = engine("small", 1)
    ledger.observe(small.key, "mig", ["MIG-mig-0-0"], small.uid)
    outcome = d.what_if(engine("high", 2), "mig", [small], [])
    assert not outcome.feasible and "mig" in outcome.unresolvable, outcome


# -- the plugin service --------------------------------------------------------------------------

def plugin(nodes: Sequence[NodeInfo]) -> tuple[PluginService, GpuLedger]:
    d, ledger = decider(nodes)
    service = ExtenderService(d, DisabledBinder(), DecisionStore(), NullObserver())
    return PluginService(service, NodeTables(lambda: [n.name for n in nodes]), lambda: (True, "")), ledger


@pytest.mark.parametrize("victim_namespace,named", [
    pytest.param("default", "gang-0", id="same namespace: named"),
    pytest.param("team-b", "1 pod of other namespaces", id="another tenant's pod: counted, never named"),
])
def test_a_gang_member_is_never_counted_as_preemptible_and_the_reason_says_so(victim_namespace, named):
    service, ledger = plugin(make_fleet("h100"))
    member = engine("gang-0", 4, namespace=victim_namespace, gang="g")
    alone = engine("alone", 4)
    holding(ledger, member, "h100", range(4))
    holding(ledger, alone, "h100", range(4, 8))
    high = engine("high", 4)
    answer = service.what_if(high, "h100", [member], [])
    assert answer.verdict == NOT_NOW
    assert f"(not preemptible: {named}: gang members, and gpusched never preempts part of a gang)" in answer.reason
    assert service.what_if(high, "h100", [member, alone], []).verdict == FITS
    # kube-scheduler's node info lacks what its dry run removed: the member is not gone by absence
    assert service.what_if(high, "h100", [member], [], present={alone.uid}).verdict == NOT_NOW


def test_a_pod_without_gpus_fits_and_a_never_stays_never():
    service, ledger = plugin(make_fleet("mig"))
    assert service.what_if(PodRef("default", "cpu", "u", make_pod("cpu", gpus=0)), "mig", [], []).verdict == FITS
    assert service.what_if(engine("high", 2), "mig", [], []).verdict == NEVER



def test_a_bound_pod_kube_scheduler_no_longer_sees_is_gone_but_a_reservation_in_flight_stays():
    """kube-scheduler saw low-b's deletion before the core's watch: judged with low-b still holding
    its GPUs, its dry run would take low-a as a second victim (seen under CPU load)."""
    d, ledger = decider(make_fleet("h100"))
    low_a, low_b, high = engine("low-a", 4), engine("low-b", 4), engine("high", 4)
    holding(ledger, low_a, "h100", range(4))
    holding(ledger, low_b, "h100", range(4, 8))
    assert not d.what_if(high, "h100", [], []).feasible
    assert d.what_if(high, "h100", [], [], present={low_a.uid}).feasible == ("h100",)
    assert not d.what_if(high, "h100", [], [], present={low_a.uid, low_b.uid}).feasible
    ledger.release(low_b.key)
    ledger.assume("default/in-flight", "h100", [gpu("h100", i) for i in range(4, 8)], "uid-in-flight")
    assert not d.what_if(high, "h100", [], [], present={low_a.uid}).feasible, "an assumed reservation is not a deletion"
