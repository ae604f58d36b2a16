"""The extender's DRA state (issue 21, item 3): slices, claims and templates decoded by the
adapters, a DRA pod's demand read from its claim, the ledger entries allocated claims make (never a
GPU promised twice silently), GpuFit counting published devices, and a DRA pod's bind recording the
claim's allocation instead of choosing GPUs."""

from __future__ import annotations

import pytest

from extender.adapters.dra import ClaimFeed, SliceFeed, TemplateFeed, decode_claim, decode_slice
from extender.framework.status import Code
from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem, PodDemand, parse_pod_demand
from extender.model.dra import DraDemand, resolve_dra_demand
from extender.model.ledger import EntryState
from extender.service.core import PodRef, Refusal, Reservation
from extender.service.dra import CLAIM_HOLDER_PREFIX, ClaimRecorder, DraState
from extender.service.framework_decider import FrameworkDecider
from extender.service.ports import StaticClaimReader
from extender.service.state import ClusterState, StateListeners
from gpusched_api.dra_drivers import GPUSCHED
from gpusched_api.inventory import NodeGpuInventory
from tests.unit.builders import (
    a100_inventory,
    default_framework,
    h100_inventory,
    make_claim_obj,
    make_dra_pod,
    make_k8s_node,
    make_pod,
    make_slice_obj,
)

H100 = h100_inventory("n1")


# --- decoding (adapters) ------------------------------------------------------------------------
@pytest.mark.parametrize("obj, expected", [
    pytest.param(make_slice_obj("n1", H100), [("gpu-0", "GPU-n1-0", 0)] + [(f"gpu-{i}", f"GPU-n1-{i}", i)
                                                                          for i in range(1, 8)], id="agent-slice"),
    pytest.param(make_slice_obj("n1", H100, driver="gpu.nvidia.com"), None, id="another-driver"),
    pytest.param({"metadata": {"name": "s"}, "spec": {"driver": "gpu.gpusched.io", "allNodes": True}}, None,
                 id="no-node"),
    pytest.param({"metadata": {"name": "s"}, "spec": {"driver": "gpu.gpusched.io", "nodeName": "n1",
                                                      "pool": {"name": "n1", "generation": 2},
                                                      "devices": [{"name": "x", "attributes": {}},
                                                                  {"name": "y", "attributes": {
                                                                      "gpu.gpusched.io/uuid": {"string": "U"}}}]}},
                 [("y", "U", None)], id="no-uuid-dropped-qualified-read"),
])
def test_a_slice_maps_each_device_to_its_gpu_unit(obj, expected):
    decoded = decode_slice(obj)
    if expected is None:
        assert decoded is None
    else:
        assert decoded is not None and decoded.node == "n1" and decoded.pool == "n1"
        assert [(d.name, d.uuid, d.index) for d in decoded.devices] == expected


def test_a_claim_decodes_its_requests_allocation_and_the_pods_it_is_reserved_for():
    obj = make_claim_obj("c", 4, allocated=[("n1", "gpu-0"), ("n1", "gpu-1")], reserved_for=["p"])
    obj["status"]["reservedFor"].append({"resource": "things", "apiGroup": "x.io", "name": "t", "uid": "u"})
    obj["spec"]["devices"]["requests"].append({"name": "alt", "firstAvailable": [{"name": "a"}]})
    claim = decode_claim(obj)
    assert claim.key == "default/c" and [(r.device_class, r.count) for r in claim.requests] == [("gpu.gpusched.io", 4)]
    assert [(d.pool, d.device) for d in claim.devices_of("gpu.gpusched.io")] == [("n1", "gpu-0"), ("n1", "gpu-1")]
    assert claim.reserved_for == (("p", "uid-p"),)
    assert decode_claim(make_claim_obj("all", mode="All")).requests[0].count is None


# --- a DRA pod's demand ------------------------------------------------------------------------
def _claims(*objs):
    return {c.key: c for c in map(decode_claim, objs)}


@pytest.mark.parametrize("pod, claims, expected", [
    pytest.param(make_dra_pod(claim="c"), _claims(make_claim_obj("c", 4)), DraDemand(("default/c",), 4, "gpu.gpusched.io"),
                 id="direct-claim"),
    pytest.param(make_dra_pod(claim="c"), _claims(make_claim_obj("c", 2, device_class="other.example.com")), None,
                 id="another-class-is-not-ours"),
    pytest.param(make_dra_pod(claim="c"), {}, "ResourceClaim default/c is not known", id="claim-missing"),
    pytest.param(make_dra_pod(claim="c"), _claims(make_claim_obj("c", mode="All")), "allocationMode All",
                 id="all-mode"),
    pytest.param({**make_dra_pod(template="t"), "status": {"resourceClaimStatuses": [
        {"name": "gpus", "resourceClaimName": "p-gpus-x"}]}}, _claims(make_claim_obj("p-gpus-x", 2)),
        DraDemand(("default/p-gpus-x",), 2, "gpu.gpusched.io"), id="template-claim-in-status"),
    pytest.param(make_dra_pod(template="t"), {}, "ResourceClaimTemplate default/t", id="template-unknown"),
])
def test_a_pods_gpus_through_dra_are_its_claims_exact_count(pod, claims, expected):
    got = resolve_dra_demand(pod, claims, {})
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got
    else:
        assert got == expected


def test_before_its_claim_exists_a_template_pod_is_counted_from_the_template():
    from extender.adapters.dra import decode_template

    template = decode_template({"metadata": {"name": "t", "namespace": "default"},
                                "spec": {"spec": make_claim_obj("x", 8)["spec"]}})
    assert resolve_dra_demand(make_dra_pod(template="t"), {}, {template.key: template}) == \
        DraDemand(("default/t",), 8, "gpu.gpusched.io", from_template=True)


@pytest.mark.parametrize("pod, dra, needle", [
    pytest.param(make_dra_pod(tp=4), DraDemand(("default/c",), 4, "gpu.gpusched.io"), None, id="tp4-from-claim"),
    pytest.param(make_dra_pod(gpus=2), DraDemand(("default/c",), 4, "gpu.gpusched.io"), "drop nvidia.com/gpu",
                 id="both-ways"),
    pytest.param(make_dra_pod(), None, "carries gpusched.io/dra", id="marker-without-claim"),
    pytest.param(make_dra_pod(tp=4), DraDemand(("default/c",), 2, "gpu.gpusched.io"), "spans 2 pods", id="count-vs-tp"),
])
def test_the_demand_reads_the_claims_count_and_refuses_contradictions(pod, dra, needle):
    demand = parse_pod_demand(pod, builtin_catalog(), dra)
    if needle is None:
        assert isinstance(demand, PodDemand) and demand.gpu_count == 4 and demand.tp == 4 and demand.dra == dra
    else:
        assert isinstance(demand, DemandProblem) and needle in demand.message, demand


# --- the ledger -------------------------------------------------------------------------------
def dra_of(state: ClusterState) -> DraState:
    assert state.dra is not None
    return state.dra


def cluster(*nodes: tuple[str, NodeGpuInventory], listeners: StateListeners | None = None) -> ClusterState:
    """ClusterState with DRA attached, nodes (name, inventory) advertising no nvidia.com/gpu,
    their slices published; ``listeners`` as the assembly gives them."""
    state = ClusterState(dra=GPUSCHED, listeners=listeners or StateListeners())
    dra = dra_of(state)
    state.nodes.replace([make_k8s_node(n, inv, allocatable=0) for n, inv in nodes])
    SliceFeed(dra).replace([make_slice_obj(n, inv) for n, inv in nodes])
    return state


def held(state: ClusterState) -> dict[str, tuple[str, list[str]]]:
    return {k: (a.node, sorted(a.unit_ids)) for k, a in state.ledger.view().assignments.items()}


ALLOC = [("n1", "gpu-0"), ("n1", "gpu-1")]


@pytest.mark.parametrize("claim, expected", [
    pytest.param(make_claim_obj("c", 2, allocated=ALLOC, reserved_for=["p"]),
                 {"default/p": ("n1", ["GPU-n1-0", "GPU-n1-1"])}, id="held-by-the-reserving-pod"),
    pytest.param(make_claim_obj("c", 2, allocated=ALLOC), {f"{CLAIM_HOLDER_PREFIX}default/c":
                                                           ("n1", ["GPU-n1-0", "GPU-n1-1"])}, id="reserved-for-none"),
    pytest.param(make_claim_obj("c", 2), {}, id="not-allocated"),
    pytest.param(make_claim_obj("c", 1, allocated=[("n9", "gpu-0")], reserved_for=["p"]),
                 {"default/p": ("n9", ["n9/dra/gpu-0"])}, id="device-without-slice-still-held"),
])
def test_an_allocated_claim_holds_its_devices_in_the_ledger(claim, expected):
    state = cluster(("n1", H100))
    ClaimFeed(dra_of(state)).apply("ADDED", claim)
    assert held(state) == expected
    assert all(a.state is EntryState.BOUND for a in state.ledger.view().assignments.values())


@pytest.mark.parametrize("event, change", [
    pytest.param("DELETED", lambda c: c, id="claim-deleted"),
    pytest.param("MODIFIED", lambda c: {**c, "status": {}}, id="deallocated"),
])
def test_a_deallocated_or_deleted_claim_frees_its_devices(event, change):
    state = cluster(("n1", H100))
    claim = make_claim_obj("c", 2, allocated=ALLOC, reserved_for=["p"])
    ClaimFeed(dra_of(state)).apply("ADDED", claim)
    ClaimFeed(dra_of(state)).apply(event, change(claim))
    assert held(state) == {}


def test_a_relist_drops_vanished_claims_and_a_pod_relist_keeps_claim_held_devices():
    state = cluster(("n1", H100))
    ClaimFeed(dra_of(state)).replace([make_claim_obj("a", 1, allocated=[("n1", "gpu-0")]),
                                  make_claim_obj("b", 1, allocated=[("n1", "gpu-1")], reserved_for=["p"])])
    state.pods.replace([])  # the reserving pod is gone: its entry goes; the unreserved claim keeps its own
    assert held(state) == {f"{CLAIM_HOLDER_PREFIX}default/a": ("n1", ["GPU-n1-0"])}
    ClaimFeed(dra_of(state)).replace([])
    assert held(state) == {}


def test_a_pods_claims_make_one_entry_together():
    state = cluster(("n1", H100))
    feed = ClaimFeed(dra_of(state))
    feed.apply("ADDED", make_claim_obj("a", 1, allocated=[("n1", "gpu-0")], reserved_for=["p"]))
    feed.apply("ADDED", make_claim_obj("b", 1, allocated=[("n1", "gpu-3")], reserved_for=["p"]))
    assert held(state) == {"default/p": ("n1", ["GPU-n1-0", "GPU-n1-3"])}
    feed.apply("DELETED", make_claim_obj("a"))
    assert held(state) == {"default/p": ("n1", ["GPU-n1-3"])}


def test_a_device_held_for_another_pod_is_a_reported_conflict_never_two_holders():
    seen = []
    state = cluster(("n1", H100), listeners=StateListeners(dra_conflict=(lambda *args: seen.append(args),)))
    assert state.dra is not None
    state.ledger.observe("default/other", "n1", ["GPU-n1-0", "GPU-n1-5"])
    ClaimFeed(dra_of(state)).apply("ADDED", make_claim_obj("c", 2, allocated=ALLOC, reserved_for=["p"]))
    assert seen == [("default/c", "n1", "default/other", ("GPU-n1-0",))]
    assert state.dra.conflicts["n1"] == 1 and state.dra.describe()["conflictsTotal"] == 1
    owners = [k for k, a in state.ledger.view().assignments.items() if "GPU-n1-0" in a.unit_ids]
    assert owners == ["default/p"]  # one holder: the allocation's
    assert held(state)["default/other"] == ("n1", ["GPU-n1-5"])


def test_a_slice_arriving_after_the_claim_re_maps_its_devices_and_marks_the_units():
    state = ClusterState(dra=GPUSCHED)
    dra = dra_of(state)
    state.nodes.replace([make_k8s_node("n1", H100, allocatable=0)])
    ClaimFeed(dra).apply("ADDED", make_claim_obj("c", 1, allocated=[("n1", "gpu-2")], reserved_for=["p"]))
    assert held(state) == {"default/p": ("n1", ["n1/dra/gpu-2"])}
    assert not any(u.dra for u in state.snapshot().nodes["n1"].units)
    SliceFeed(dra).apply("ADDED", make_slice_obj("n1", H100))
    assert held(state) == {"default/p": ("n1", ["GPU-n1-2"])}
    assert all(u.dra for u in state.snapshot().nodes["n1"].units)
    SliceFeed(dra).apply("DELETED", make_slice_obj("n1", H100))
    assert not any(u.dra for u in state.snapshot().nodes["n1"].units)


def tainted(slice_obj: dict, *devices: str, generation: int) -> dict:
    """``slice_obj`` at ``generation`` with a NoSchedule taint on each named device."""
    spec = {**slice_obj["spec"], "pool": {**slice_obj["spec"]["pool"], "generation": generation},
            "devices": [{**d, "taints": [{"key": "k", "effect": "NoSchedule"}]} if d["name"] in devices else d
                        for d in slice_obj["spec"]["devices"]]}
    return {**slice_obj, "spec": spec}


SLICE = make_slice_obj("n1", H100)


@pytest.mark.parametrize("events, heard", [
    pytest.param([("ADDED", SLICE)], ["n1"], id="first-slice"),
    pytest.param([("ADDED", tainted(SLICE, "gpu-0", generation=1))], ["n1"], id="first-slice-partly-tainted"),
    pytest.param([("ADDED", SLICE), ("MODIFIED", tainted(SLICE, generation=2))], ["n1"], id="unchanged-devices"),
    pytest.param([("ADDED", SLICE), ("MODIFIED", tainted(SLICE, "gpu-3", generation=2))], ["n1"], id="a-taint-added"),
    pytest.param([("ADDED", tainted(SLICE, "gpu-3", generation=1)), ("MODIFIED", tainted(SLICE, generation=2))],
                 ["n1", "n1"], id="a-taint-removed"),
    pytest.param([("ADDED", SLICE), ("DELETED", SLICE)], ["n1"], id="deleted"),
])
def test_a_slice_offering_a_unit_it_did_not_before_tells_the_capacity_listeners(events, heard):
    """A DRA pod refused for want of published devices is retried when its node's slice offers
    one (the plugin-mode requeue stream and extender mode's nudge hang on this); a slice that
    offers nothing new — the same devices again, a taint added, the slice gone — says nothing."""
    rose: list[str] = []
    state = ClusterState(dra=GPUSCHED, listeners=StateListeners(capacity_rose=(rose.append,)))
    state.nodes.replace([make_k8s_node("n1", H100, allocatable=0)])
    for kind, obj in events:
        SliceFeed(dra_of(state)).apply(kind, obj)
    assert rose == heard
    published = [u.dra for u in state.snapshot().nodes["n1"].units]
    assert any(published) == (events[-1][0] != "DELETED")


# --- decisions --------------------------------------------------------------------------------
def decider(state: ClusterState, reader: StaticClaimReader | None = None) -> FrameworkDecider:
    return FrameworkDecider(default_framework(), builtin_catalog(), state.ledger, state.snapshot,
                            dra=ClaimRecorder(dra_of(state), state.ledger, reader))


def ref(pod) -> PodRef:
    return PodRef(pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"], pod)


def test_a_dra_pods_nodes_are_judged_by_published_devices_and_the_same_plugins():
    state = cluster(("n1", H100), ("pairs", a100_inventory("pairs")))
    state.nodes.apply("ADDED", make_k8s_node("plain", h100_inventory("plain"), allocatable=0))  # no slice
    ClaimFeed(dra_of(state)).apply("ADDED", make_claim_obj("c", 4))
    pod = make_dra_pod(tp=4, annotations={"gpusched.io/require-nvlink": "true"})
    outcome = decider(state).filter(ref(pod), ["n1", "pairs", "plain"], None)
    assert outcome.feasible == ("n1",), outcome
    # GPUs by its inventory, no slice yet: its DRA driver may still publish, so the pod waits for it.
    assert "publishes no gpu.gpusched.io devices yet" in outcome.failed["plain"], outcome
    assert "NVLink" in outcome.unresolvable["pairs"] or "NVLink" in outcome.failed.get("pairs", ""), outcome
    assert outcome.details["demand"]["dra"] == {"claims": ["default/c"], "count": 4, "deviceClass": "gpu.gpusched.io",
                                                "fromTemplate": False, "islandInClaim": False}


@pytest.mark.parametrize("slice_gpus, result, reason", [
    pytest.param(None, "unschedulable", "node publishes no gpu.gpusched.io devices yet (ResourceSlice) for its 8 "
                 "GPU units; the pod's claims need 4", id="no-slice-yet-waits"),
    pytest.param(2, "unresolvable", "node publishes 2 gpu.gpusched.io devices (ResourceSlice); the pod's claims "
                 "need 4", id="too-few-published-never-fits"),
])
def test_a_gpu_node_whose_slice_has_not_come_keeps_a_dra_pod_waiting(slice_gpus, result, reason):
    """The pod is retried when the slice comes (``waiting_pods`` names only unschedulable pods);
    a slice that publishes too few devices is the node's answer, as too small an nvidia.com/gpu is."""
    state = ClusterState(dra=GPUSCHED)
    state.nodes.replace([make_k8s_node("n1", H100, allocatable=0)])
    if slice_gpus is not None:
        slice_obj = make_slice_obj("n1", H100)
        slice_obj["spec"]["devices"] = slice_obj["spec"]["devices"][:slice_gpus]
        SliceFeed(dra_of(state)).apply("ADDED", slice_obj)
    ClaimFeed(dra_of(state)).apply("ADDED", make_claim_obj("c", 4))
    outcome = decider(state).filter(ref(make_dra_pod(tp=4)), ["n1"], None)
    assert outcome.result == result
    assert {**outcome.failed, **outcome.unresolvable} == {"n1": reason}


def test_a_tp3_dra_pod_for_a_64_head_model_is_refused_everywhere_by_tensor_parallel():
    state = cluster(("n1", H100))
    ClaimFeed(dra_of(state)).apply("ADDED", make_claim_obj("c", 3))
    outcome = decider(state).filter(ref(make_dra_pod(tp=3)), ["n1"], None)
    assert outcome.feasible == () and "must be divisible by tensor parallel size (3)" in outcome.unresolvable["n1"]
    verdict = outcome.details["verdicts"]["n1"]
    assert any(s["plugin"] == "TensorParallel" and s["code"] == Code.UNSCHEDULABLE_AND_UNRESOLVABLE.name
               for s in verdict)


def test_held_devices_send_the_next_dra_pod_elsewhere():
    state = cluster(("n1", a100_inventory("n1")), ("n2", a100_inventory("n2")))
    feed = ClaimFeed(dra_of(state))
    feed.apply("ADDED", make_claim_obj("full", 4, allocated=[("n1", f"gpu-{i}") for i in range(4)],
                                       reserved_for=["first"]))
    feed.apply("ADDED", make_claim_obj("c", 2))
    outcome = decider(state).filter(ref(make_dra_pod()), ["n1", "n2"], None)
    assert outcome.feasible == ("n2",) and "only 0 of 4 GPUs free" in outcome.failed["n1"]


@pytest.mark.parametrize("watched, read, expected", [
    pytest.param(make_claim_obj("c", 2, allocated=ALLOC, reserved_for=["p"]), None, "reserved", id="watch-has-it"),
    pytest.param(make_claim_obj("c", 2), make_claim_obj("c", 2, allocated=ALLOC, reserved_for=["p"]), "reserved",
                 id="read-at-bind-after-prebind"),
    pytest.param(make_claim_obj("c", 2), make_claim_obj("c", 2), "is not allocated", id="prebind-did-not-run"),
    pytest.param(make_claim_obj("c", 2), make_claim_obj("c", 2, allocated=[("n2", "gpu-0")], reserved_for=["p"]),
                 "allocated on n2, not on n1", id="allocated-elsewhere"),
])
def test_bind_of_a_dra_pod_records_the_claims_allocation_and_writes_no_gpu_annotation(watched, read, expected):
    state = cluster(("n1", H100), ("n2", h100_inventory("n2")))
    ClaimFeed(dra_of(state)).apply("ADDED", watched)
    reader = StaticClaimReader({"default/c": decode_claim(read)} if read else {})
    d = decider(state, reader)
    pod = ref(make_dra_pod())
    assert d.filter(pod, ["n1"], None).feasible == ("n1",)
    reserved = d.reserve(pod, "n1", "id-1")  # before PreBind: nothing chosen, the claim named for the bind
    assert isinstance(reserved, Reservation) and reserved.claims_at_bind == ("default/c",), reserved
    assert reserved.annotations == {}
    answer = d.permitted(pod, "n1")  # the bind, after PreBind
    if expected != "reserved":
        assert isinstance(answer, Refusal) and expected in answer.reason, answer
        return
    assert isinstance(answer, Reservation), answer
    assert answer.annotations == {}  # the allocation is the assignment: nothing to contradict it
    assert [(x["device"], x["gpu"]) for x in answer.details["dra"]["devices"]] == \
        [("gpu-0", "GPU-n1-0"), ("gpu-1", "GPU-n1-1")]
    assert answer.details["dra"]["ledger"] == ["GPU-n1-0", "GPU-n1-1"]
    assert "gpu-0 (GPU 0, GPU-n1-0), gpu-1 (GPU 1, GPU-n1-1)" in answer.summary
    assert held(state) == {"default/p": ("n1", ["GPU-n1-0", "GPU-n1-1"])}
    d.unreserve(pod, "bind failed")  # the claim's entry is the watch's: unreserve leaves it
    assert held(state) == {"default/p": ("n1", ["GPU-n1-0", "GPU-n1-1"])}


def test_template_feed_replaces_and_deletes():
    state = cluster(("n1", H100))
    obj = {"metadata": {"name": "t", "namespace": "default"}, "spec": {"spec": make_claim_obj("x", 2)["spec"]}}
    TemplateFeed(dra_of(state)).replace([obj])
    assert state.dra is not None and isinstance(state.dra.resolve(make_dra_pod(template="t")), DraDemand)
    TemplateFeed(dra_of(state)).apply("DELETED", obj)
    assert isinstance(state.dra.resolve(make_dra_pod(template="t")), str)



def _dra(*fields: str, count: int = 2) -> DraDemand:
    return DraDemand(tuple(f.partition(":")[0] for f in fields), count, "gpu.gpusched.io", count_fields=fields)


def _dra_pod_with_args(*args: str) -> dict:
    """A gang member's DRA pod whose engine is ``vllm`` with ``args``."""
    pod = make_dra_pod(annotations={"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2"})
    pod["spec"]["containers"][0]["args"] = list(args)
    return pod


C_FIELD = "default/c: spec.devices.requests[gpus].exactly.count"
D_FIELD = "default/d: spec.devices.requests[more].exactly.count"


@pytest.mark.parametrize("pod, dra, names, never", [
    pytest.param(make_dra_pod(tp=4), _dra(C_FIELD), [f"set {C_FIELD} to 4", "spans 2 pods"], "resources.limits",
                 id="dra-count-below-tp-names-the-claim"),
    pytest.param(make_pod(gpus=2, model="meta-llama/Llama-3.1-70B-Instruct", tp=4), None,
                 ["set resources.limits['nvidia.com/gpu'] to 4"], "exactly.count", id="device-plugin-names-the-limit"),
    pytest.param(_dra_pod_with_args("serve", "m", "-tp", "4", "--nnodes", "2"), _dra(C_FIELD, count=4),
                 ["requests 4 gpu.gpusched.io devices through default/c", f"set {C_FIELD} to 2"],
                 "resources.limits", id="dra-nnodes-names-the-claim"),
    pytest.param(_dra_pod_with_args("serve", "m", "-tp", "4"), _dra(C_FIELD, D_FIELD, count=3),
                 [f"set the counts ({C_FIELD} and {D_FIELD}) together to 4"], "resources.limits",
                 id="two-claims-named-together"),
])
def test_a_count_that_does_not_fit_the_parallel_sizes_names_where_the_count_is_set(pod, dra, names, never):
    demand = parse_pod_demand(pod, builtin_catalog(), dra)
    assert isinstance(demand, DemandProblem), demand
    for needle in names:
        assert needle in demand.message, demand.message
    assert never not in demand.message, demand.message


def test_the_resolved_demand_names_each_requests_count_field():
    got = resolve_dra_demand(make_dra_pod(claim="c"), _claims(make_claim_obj("c", 4)), {})
    assert isinstance(got, DraDemand) and got.count_fields == (C_FIELD,)


@pytest.mark.parametrize("other, shares", [
    pytest.param(("q", "default/c2", 4), True, id="another-pod-another-claim-same-count"),
    pytest.param(("q", "default/c2", 2), False, id="another-count"),
])
def test_dra_pods_asking_the_same_share_the_frameworks_answers(other, shares):
    """The per-group answer memo is keyed by the demand without identity: a DRA pod's claim names
    are identity (each pod has its own claim), so 2,000 single-claim pods do not each miss it."""
    name, claim, count = other
    first = parse_pod_demand(make_dra_pod("p", tp=4), builtin_catalog(),
                             DraDemand(("default/c",), 4, "gpu.gpusched.io", count_fields=("default/c: x",)))
    second = parse_pod_demand(make_dra_pod(name, claim=claim.split("/")[1], tp=count), builtin_catalog(),
                              DraDemand((claim,), count, "gpu.gpusched.io"))
    assert isinstance(first, PodDemand) and isinstance(second, PodDemand)
    assert (first.without_identity == second.without_identity) is shares
    assert first.dra is not None and first.dra.claims == ("default/c",)  # the pod's own demand keeps them


@pytest.mark.parametrize("pod, needle", [
    pytest.param(make_dra_pod(tp=4), "start it with --dra", id="marker-without-dra-state"),
    pytest.param(make_dra_pod(marker=False), None, id="no-marker-is-not-a-gpu-pod-here"),
])
def test_an_extender_without_dra_state_says_so_to_a_marked_pod(pod, needle):
    state = cluster(("n1", H100))
    d = FrameworkDecider(default_framework(), builtin_catalog(), state.ledger, state.snapshot)  # no --dra
    got = d.demand(ref(pod))
    if needle is None:
        assert isinstance(got, PodDemand) and got.dra is None and got.gpu_count == 0
    else:
        assert isinstance(got, DemandProblem) and needle in got.message, got


def test_a_dra_pod_whose_claim_the_core_has_not_seen_is_an_error_to_retry_not_a_verdict():
    """kube-scheduler's DRA plugin refuses a pod whose claim does not exist, so a claim the core
    lacks is its watch lagging: an error makes kube-scheduler retry after its backoff (a verdict
    left the pod waiting for an event that had passed: CI's test_tp3_for_a_64_head_model)."""
    state = cluster(("n1", H100))
    pod = make_dra_pod(tp=4)
    before = decider(state).filter(ref(pod), ["n1"], None)
    assert before.result == "error" and "is not known to gpusched (yet)" in before.error, before
    ClaimFeed(dra_of(state)).apply("ADDED", make_claim_obj("c", 4))
    assert decider(state).filter(ref(pod), ["n1"], None).feasible == ("n1",)
