"""Issue 20, share mode in the decision core: a pod asks for part of one GPU
(``gpusched.io/gpu-memory`` + one ``gpusched.io/gpu-share``); the ledger never promises a GPU's
memory twice, nor a GPU whole and shared at once; placement packs shares onto GPUs already shared,
judges each GPU on its size less foreign memory and the shares promised, and a GPU whose sharer is
over its share takes no new one."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem, PodDemand, parse_pod_demand
from extender.model.ledger import GpuLedger
from extender.model.placement import place_share
from extender.model.telemetry import GpuSample, NodeTelemetry, ShareSample
from extender.service.state import ClusterState, StateListeners
from extender.service.telemetry import TelemetryStore
from gpusched_api.inventory import NodeGpuInventory
from tests.unit.builders import H100_MIB, default_framework, make_gpu, make_k8s_node, make_node, make_share_pod

GIB, MIB = 1 << 30, 1 << 20
GPU0 = "GPU-n-0"


def demand_of(pod) -> PodDemand | DemandProblem:
    return parse_pod_demand(pod, builtin_catalog())


def one_gpu(name: str = "n", count: int = 1) -> NodeGpuInventory:
    return NodeGpuInventory(tuple(make_gpu(i, node=name) for i in range(count)))


# -- demand ------------------------------------------------------------------------------------
@pytest.mark.parametrize("pod,problem", [
    pytest.param(make_share_pod(), None, id="share"),
    pytest.param(make_share_pod(slots=None), "add resources.limits['gpusched.io/gpu-share']: 1", id="no-slot"),
    pytest.param(make_share_pod(memory=None), "add annotation gpusched.io/gpu-memory", id="no-memory"),
    pytest.param(make_share_pod(gpus=1), "whole GPUs or one share, never both", id="share-and-gpus"),
    pytest.param(make_share_pod(slots=2), "set it to 1", id="two-slots"),
    pytest.param(make_share_pod(memory="512Mi"), "at least 1.0 GiB", id="tiny"),
    pytest.param(make_share_pod(memory="lots"), "annotation gpusched.io/gpu-memory", id="unreadable"),
    pytest.param(make_share_pod(args=["serve", "meta-llama/Llama-3.1-8B-Instruct", "-tp", "2"]),
                 "use nvidia.com/gpu for a parallel engine", id="tensor-parallel"),
    pytest.param(make_share_pod(annotations={"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2"}),
                 "does not place shares as members of a group", id="in-a-gang"),
])
def test_a_share_is_one_engine_on_part_of_one_gpu(pod, problem):
    demand = demand_of(pod)
    if problem is None:
        assert isinstance(demand, PodDemand), demand
        assert (demand.gpu_count, demand.share_bytes, demand.is_share) == (1, 30 * GIB, True)
    else:
        assert isinstance(demand, DemandProblem)
        assert problem in demand.message


# -- ledger ------------------------------------------------------------------------------------
def test_shares_fill_a_gpu_up_to_its_capacity_and_never_mix_with_a_whole_holder():
    ledger = GpuLedger()
    cap = 80 * 1024
    assert ledger.assume("ns/a", "n", [GPU0], share_mib=30 * 1024, capacity_mib=cap)
    assert ledger.assume("ns/b", "n", [GPU0], share_mib=30 * 1024, capacity_mib=cap)
    assert not ledger.assume("ns/c", "n", [GPU0], share_mib=30 * 1024, capacity_mib=cap), "80 GiB promised twice"
    assert ledger.assume("ns/c", "n", [GPU0], share_mib=20 * 1024, capacity_mib=cap), "exactly full is allowed"
    assert not ledger.assume("ns/whole", "n", [GPU0]), "a shared GPU is not free whole"
    view = ledger.view()
    assert dict(view.shares_on("n")) == {GPU0: 80 * 1024}
    assert GPU0 in view.held_on("n")
    assert [a.pod_key for a in view.sharers_of("n", GPU0)] == ["ns/a", "ns/b", "ns/c"]
    for key in ("ns/a", "ns/b", "ns/c"):
        ledger.release(key)
    assert ledger.view().shares_on("n") == {} and GPU0 not in ledger.view().held_on("n")
    assert ledger.assume("ns/whole", "n", [GPU0])
    assert not ledger.assume("ns/a", "n", [GPU0], share_mib=1024, capacity_mib=cap), "a whole GPU is not shared"


def test_a_reassumed_share_replaces_its_own_and_the_watch_wins():
    ledger = GpuLedger()
    cap = 80 * 1024
    assert ledger.assume("ns/a", "n", [GPU0], share_mib=50 * 1024, capacity_mib=cap)
    assert ledger.assume("ns/a", "n", [GPU0], share_mib=60 * 1024, capacity_mib=cap), "its own share is not counted"
    assert ledger.view().shares_on("n")[GPU0] == 60 * 1024
    assert ledger.assume("ns/whole", "n", ["GPU-n-1"])
    assert ledger.observe("ns/b", "n", ["GPU-n-1"], share_mib=1024) == ("ns/whole",), "observed truth displaces"
    assert ledger.observe("ns/w2", "n", [GPU0]) == ("ns/a",), "a whole observation displaces the sharers"
    with pytest.raises(ValueError):
        ledger.assume("ns/x", "n", [GPU0, "GPU-n-1"], share_mib=1024, capacity_mib=cap)


# -- placement and filter ------------------------------------------------------------------------
def snapshot_with(ledger: GpuLedger, count: int = 2, **node_kwargs):
    from extender.model.snapshot import ClusterSnapshot
    return ClusterSnapshot.build([make_node("n", one_gpu("n", count), **node_kwargs)], ledger.view())


def test_shares_go_to_a_gpu_already_shared_before_an_untouched_one():
    ledger = GpuLedger()
    ledger.assume("ns/a", "n", ["GPU-n-1"], share_mib=30 * 1024, capacity_mib=H100_MIB)
    snapshot = snapshot_with(ledger)
    node = snapshot.nodes["n"]
    placed = place_share(snapshot.free_units(node), 30 * 1024)
    assert placed is not None and placed.unit_ids == ("GPU-n-1",) and placed.promised_mib == 30 * 1024
    roomier = place_share(snapshot.free_units(node), 60 * 1024)
    assert roomier is not None and roomier.unit_ids == (GPU0,), "no room there: the untouched GPU"


def filter_share(snapshot, pod=None):
    framework = default_framework()
    return framework.filter(snapshot, demand_of(pod or make_share_pod("c")), ["n"]).per_node["n"]


def test_a_share_that_does_not_fit_waits_with_the_shares_named():
    ledger = GpuLedger()
    for key in ("ns/a", "ns/b"):
        assert ledger.assume(key, "n", [GPU0], share_mib=30 * 1024, capacity_mib=H100_MIB)
    verdict = filter_share(snapshot_with(ledger, count=1))
    assert verdict.code.name == "UNSCHEDULABLE", verdict
    reason = verdict.statuses[-1].reason
    assert "GPU 0: 79.6 GiB usable, 60.0 GiB promised to shares, 19.6 GiB left" in reason, reason
    assert "30.0 GiB share" in reason
    ledger.release("ns/b")
    assert filter_share(snapshot_with(ledger, count=1)).code.name == "SUCCESS"


def test_a_share_larger_than_any_gpu_never_fits_and_a_whole_gpu_holder_blocks_shares():
    ledger = GpuLedger()
    big = filter_share(snapshot_with(ledger, count=1), make_share_pod("c", memory="100Gi"))
    assert big.code.name == "UNSCHEDULABLE_AND_UNRESOLVABLE"
    assert "at most 79.6 GiB < the 100.0 GiB share" in big.statuses[-1].reason
    ledger.assume("ns/w", "n", [GPU0])
    held = filter_share(snapshot_with(ledger, count=1))
    assert held.code.name == "UNSCHEDULABLE" and "GPU 0 held whole by a pod" in held.statuses[-1].reason


# -- telemetry: real free memory and over-share ---------------------------------------------------------
def cluster(clock=lambda: 2.0, **listeners):
    """The state and its telemetry reconciler (which takes the reports), with ``listeners``."""
    state = ClusterState(clock=clock, telemetry=TelemetryStore(clock=clock), listeners=StateListeners(**listeners))
    state.nodes.replace([make_k8s_node("n", one_gpu("n", 1)), make_k8s_node("m", one_gpu("m", 1))])
    assert state.reconciler is not None
    return state, state.reconciler


def report(node: str = "n", seq: int = 1, *, foreign_gib: int = 0, shares=()) -> NodeTelemetry:
    gpu = GpuSample(f"GPU-{node}-0", 0, H100_MIB * MIB, (H100_MIB - foreign_gib * 1024) * MIB, foreign_gib * GIB,
                    shares=tuple(shares))
    return NodeTelemetry(node, seq, 1.5, 1.0, "fake", MappingProxyType({gpu.uuid: gpu}))


def test_a_share_is_judged_on_real_free_memory_foreign_usage_included():
    state, store = cluster()
    store.ingest(report(foreign_gib=30))
    snapshot = state.snapshot()
    unit = snapshot.nodes["n"].units[0]
    assert unit.share_capacity_mib == 49 * 1024, "79.6 GiB less 30 GiB foreign, in whole GiB"
    first = filter_share(snapshot)
    assert first.code.name == "SUCCESS"
    ledger = state.ledger
    assert ledger.assume("ns/a", "n", [GPU0], share_mib=30 * 1024, capacity_mib=unit.share_capacity_mib)
    second = filter_share(state.snapshot())
    assert second.code.name == "UNSCHEDULABLE"
    assert ("GPU 0: 79.6 GiB, foreign processes leave 49.0 GiB, 30.0 GiB promised to shares, 19.0 GiB left"
            in second.statuses[-1].reason)


def test_a_sharer_over_its_share_closes_the_gpu_and_is_heard_once_for_its_own_node_only():
    heard = []
    state, store = cluster(over_share=(lambda *args: heard.append(args),))
    state.pods.replace([make_share_pod("a", "ns", node="n", assigned=GPU0)])
    recorded = state.ledger.assignment("ns/a")
    assert recorded is not None and recorded.share_mib == 30 * 1024, "the watch records the share"
    over = ShareSample("ns/a", 30 * GIB, 34 * GIB)
    stranger = ShareSample("ns/elsewhere", 30 * GIB, 40 * GIB)
    store.ingest(report(seq=1, shares=[over, stranger]))
    unit = state.snapshot().nodes["n"].units[0]
    assert "ns/a uses 34.0 GiB > its 30.0 GiB share" in unit.share_closed
    closed = filter_share(state.snapshot(), make_share_pod("c", memory="4Gi"))
    assert closed.code.name == "UNSCHEDULABLE" and "closed to new shares" in closed.statuses[-1].reason
    store.ingest(report(seq=2, shares=[over]))
    assert heard == [("ns/a", "n", GPU0, 34 * GIB, 30 * GIB)], "once per episode, never for another node's pod"
    assert state.over_shares() == {"n": {("ns/a", GPU0): (34 * GIB, 30 * GIB)}}
    store.ingest(report(seq=3, shares=[ShareSample("ns/a", 30 * GIB, 29 * GIB)]))
    assert state.snapshot().nodes["n"].units[0].share_closed == "" and state.over_shares() == {}
    assert filter_share(state.snapshot(), make_share_pod("c", memory="4Gi")).code.name == "SUCCESS"


def test_a_pod_leaving_the_ledger_is_heard_on_its_node_after_the_release():
    """The nudge that makes kube-scheduler retry comes after the GPUs are free in the ledger, so
    a retry racing the watch cannot find them still held."""
    heard: list[tuple[str, bool]] = []
    state, _ = cluster(released=(lambda node: heard.append((node, state.ledger.assignment("ns/a") is None)),))
    sharer = make_share_pod("a", "ns", node="n", assigned=GPU0)
    state.pods.replace([sharer])
    state.pods.apply("DELETED", sharer)
    state.pods.apply("DELETED", make_share_pod("never-held", "ns", node="n"))
    assert heard == [("n", True)], "once, for the node, with the share already released"


# -- what a pod's author reads (issue 39) -------------------------------------------------------------
def test_a_rejected_share_hears_aggregates_never_another_tenants_pods_or_their_memory():
    """A FailedScheduling reason (and the PodScheduled condition, and the extender's failed-node
    reason it comes from) is read by the pod's author: tenant A learns why the GPU takes no share
    and how much room is left, but not that tenant B runs ``secret-model`` nor how much it uses.
    The per-pod detail stays in /debug/nodes, the admin's."""
    from extender.service.core import PodRef
    from extender.service.framework_decider import FrameworkDecider

    state, store = cluster()
    state.pods.replace([make_share_pod("secret-model", "tenant-b", node="n", assigned=GPU0),
                        make_share_pod("quiet-embedder", "tenant-b", memory="10Gi", node="n", assigned=GPU0)])
    store.ingest(report(shares=[ShareSample("tenant-b/secret-model", 30 * GIB, 37 * GIB),
                                ShareSample("tenant-b/quiet-embedder", 10 * GIB, 9 * GIB)]))
    assert "tenant-b/secret-model uses 37.0 GiB" in state.snapshot().nodes["n"].units[0].share_closed, "admin detail"
    decider = FrameworkDecider(default_framework(), builtin_catalog(), state.ledger, state.snapshot, telemetry=state)
    pod = make_share_pod("chat", "tenant-a", memory="4Gi")
    outcome = decider.filter(PodRef("tenant-a", "chat", "uid-chat", pod), ["n"], None)
    reason = outcome.failed["n"]
    assert "GPU 0 closed to new shares" in reason, reason
    told = " ".join([reason, outcome.summary, *(s.reason for s in filter_share(state.snapshot(), pod).statuses)])
    for secret in ("tenant-b", "secret-model", "quiet-embedder", "37.0 GiB", "30.0 GiB", "10.0 GiB", "9.0 GiB"):
        assert secret not in told, (secret, told)
