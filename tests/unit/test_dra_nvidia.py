"""gpusched on NVIDIA's DRA driver (issue 47): NVIDIA's ResourceSlices (the pinned release's
format, devcluster.nvidia_dra) mapped to the agents' GPUs by UUID, bad slice input ignored and
counted, DRA pods of NVIDIA's DeviceClasses judged and held in the ledger by UUID, and an NVLink
group kept to nodes where the allocator's first fit lies in one island."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.nvidia_dra import nvidia_slice
from extender.adapters.dra import ClaimFeed, SliceFeed, decode_slice
from extender.model.catalog import builtin_catalog
from extender.model.dra import resolve_dra_demand
from extender.model.snapshot import ORDER_UNKNOWN
from extender.service.core import PodRef
from extender.service.dra import ClaimRecorder, DraState
from extender.service.framework_decider import FrameworkDecider
from extender.service.state import ClusterState, StateListeners
from gpusched_api.dra_drivers import GPUSCHED, NVIDIA
from nodeagent.gpu.fake import FakeFleetReader, preset_path
from nodeagent.gpu.model import to_inventory
from tests.unit.builders import default_framework, make_claim_obj, make_dra_pod, make_k8s_node

NVLINK = {"gpusched.io/require-nvlink": "true"}


def fleet_state(preset: str, node: str) -> Any:
    return FakeFleetReader(preset_path(preset), node_name=node).read()


def nvidia_obj(preset: str, node: str, order: list[int] | None = None, name: str | None = None) -> dict[str, Any]:
    obj = nvidia_slice(node, fleet_state(preset, node), order=order)
    obj["metadata"] = {"name": name or f"{node}-gpu.nvidia.com-abcde"}
    return obj


def inventory_of(preset: str, node: str) -> Any:
    return to_inventory(fleet_state(preset, node))


def cluster(*nodes: tuple[str, str, list[int] | None]) -> ClusterState:
    """ClusterState on NVIDIA's driver with nodes (name, preset, device order) whose inventory is
    the agent's (the fleet file's UUIDs) and whose NVIDIA slices are published."""
    state = ClusterState(dra=NVIDIA, listeners=StateListeners())
    assert state.dra is not None
    state.nodes.replace([make_k8s_node(n, inventory_of(p, n), allocatable=0) for n, p, _ in nodes])
    SliceFeed(state.dra).replace([nvidia_obj(p, n, order) for n, p, order in nodes])
    return state


def nvidia_claim(name: str, count: int, **kwargs: Any) -> dict[str, Any]:
    obj = make_claim_obj(name, count, device_class="gpu.nvidia.com", **kwargs)
    for result in ((obj.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
        result["driver"] = "gpu.nvidia.com"
    return obj


def decide(state: ClusterState, pod: dict[str, Any], nodes: list[str]) -> Any:
    assert state.dra is not None
    decider = FrameworkDecider(default_framework(), builtin_catalog(), state.ledger, state.snapshot,
                               dra=ClaimRecorder(state.dra, state.ledger, None))
    return decider.filter(PodRef(pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"], pod),
                          nodes, None)


# --- NVIDIA's slices --------------------------------------------------------------------------------
def test_nvidias_slice_maps_each_device_to_the_agents_gpu_by_uuid_in_slice_order():
    decoded = decode_slice(nvidia_obj("a100", "pairs", [2, 0, 3, 1]), NVIDIA)
    uuids = {g.index: g.uuid for g in fleet_state("a100", "pairs").gpus}
    assert decoded is not None and (decoded.node, decoded.pool, decoded.pool_slices) == ("pairs", "pairs", 1)
    assert [(d.name, d.uuid, d.kind) for d in decoded.devices] == [(f"gpu-{i}", uuids[i], "gpu") for i in (2, 0, 3, 1)]
    assert decode_slice(nvidia_obj("a100", "pairs"), GPUSCHED) is None  # not the judged driver's


def bad(devices: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n"},
                                                "devices": devices, **spec}}


def uuid(value: Any) -> dict[str, Any]:
    return {"uuid": value}


@pytest.mark.parametrize("obj, kept, reasons", [
    pytest.param(bad([], driver="example.com/gpu"), None, {"other-driver": 1}, id="another-driver"),
    pytest.param(bad([], nodeName=None, allNodes=True), None, {"no-node": 1}, id="no-node"),
    pytest.param(bad([{"name": "gpu-0", "attributes": {}}]), [], {"no-uuid": 1}, id="no-uuid"),
    pytest.param(bad([{"name": "gpu-0", "attributes": uuid({"int": 7})}]), [], {"wrong-type": 1, "no-uuid": 1},
                 id="uuid-of-wrong-type"),
    pytest.param(bad([{"name": "gpu-0", "attributes": uuid({"string": 7})}]), [], {"wrong-type": 1, "no-uuid": 1},
                 id="uuid-string-not-a-string"),
    pytest.param(bad([{"name": "gpu-0", "attributes": {**uuid({"string": "U"}), "index": {"string": "0"}}}]),
                 [("gpu-0", "U", None)], {"wrong-type": 1}, id="index-of-wrong-type-read-absent"),
    pytest.param(bad([{"name": "gpu-0", "attributes": uuid({"string": "U"})},
                      {"name": "gpu-1", "attributes": uuid({"string": "U"})}]), [("gpu-0", "U", None)],
                 {"duplicate-uuid": 1}, id="duplicate-uuid"),
    pytest.param(bad(["not a device", {"name": "gpu-0", "attributes": "nonsense", "taints": 3}], pool="x"), [],
                 {"no-uuid": 1}, id="malformed-devices-skipped"),
])
def test_bad_slice_input_is_ignored_counted_and_never_a_crash(obj, kept, reasons):
    state = DraState(ClusterState().ledger, driver=NVIDIA)
    SliceFeed(state).apply("ADDED", obj)
    assert dict(state.ignored) == reasons
    decoded = decode_slice(obj, NVIDIA)
    assert (None if decoded is None else [(d.name, d.uuid, d.index) for d in decoded.devices]) == kept


def test_first_fit_ranks_follow_the_slice_order_skip_slice_tainted_devices_and_are_unknown_across_slices():
    state = DraState(ClusterState().ledger, driver=NVIDIA)
    obj = nvidia_obj("a100", "n", [2, 0, 3, 1])
    obj["spec"]["devices"][1]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    SliceFeed(state).apply("ADDED", obj)
    uuids = {g.index: g.uuid for g in fleet_state("a100", "n").gpus}
    assert dict(state.ranks_of("n")) == {uuids[2]: 0, uuids[0]: None, uuids[3]: 1, uuids[1]: 2}
    obj["spec"]["pool"]["resourceSliceCount"] = 2
    SliceFeed(state).apply("MODIFIED", obj)
    assert set(state.ranks_of("n").values()) == {None, ORDER_UNKNOWN}


# --- claims and decisions -----------------------------------------------------------------------------
@pytest.mark.parametrize("driver, device_class, constraint, matched", [
    pytest.param(NVIDIA, "gpu.nvidia.com", None, False, id="nvidia"),
    pytest.param(NVIDIA, "gpu.nvidia.com", "resource.kubernetes.io/pcieRoot", False, id="nvidia-pcie-root"),
    pytest.param(GPUSCHED, "gpu.gpusched.io", "gpu.gpusched.io/nvlinkIsland", True, id="own-island-constraint"),
    pytest.param(GPUSCHED, "gpu.gpusched.io", None, False, id="own-without-constraint"),
])
def test_a_claim_of_the_drivers_class_is_the_pods_gpus_and_says_whether_it_keeps_one_island(
        driver, device_class, constraint, matched):
    from extender.adapters.dra import decode_claim

    obj = make_claim_obj("c", 2, device_class=device_class)
    if constraint:
        obj["spec"]["devices"]["constraints"] = [{"requests": ["gpus"], "matchAttribute": constraint}]
    claim = decode_claim(obj)
    demand = resolve_dra_demand(make_dra_pod(), {claim.key: claim}, {}, driver)
    assert not isinstance(demand, str) and demand is not None
    assert (demand.count, demand.device_class, demand.island_matched, demand.mig) == (2, device_class, matched, False)
    other = GPUSCHED if driver is NVIDIA else NVIDIA
    assert resolve_dra_demand(make_dra_pod(), {claim.key: claim}, {}, other) is None  # another driver's class


def test_an_allocated_nvidia_claim_holds_the_agents_gpus_by_uuid():
    state = cluster(("h", "h100", None))
    assert state.dra is not None
    ClaimFeed(state.dra).apply("ADDED", nvidia_claim("c", 2, allocated=[("h", "gpu-3"), ("h", "gpu-5")],
                                                     reserved_for=["p"]))
    uuids = {g.index: g.uuid for g in fleet_state("h100", "h").gpus}
    held = state.ledger.view().assignments["default/p"]
    assert (held.node, sorted(held.unit_ids)) == ("h", sorted([uuids[3], uuids[5]]))


@pytest.mark.parametrize("order, feasible", [
    pytest.param([0, 1, 2, 3], True, id="first-fit-takes-a-pair"),
    pytest.param([0, 2, 1, 3], False, id="first-fit-spans-the-pairs"),
])
def test_an_nvlink_group_goes_only_where_first_fit_lies_in_one_island(order, feasible):
    state = cluster(("pairs", "a100", order))
    assert state.dra is not None
    ClaimFeed(state.dra).apply("ADDED", nvidia_claim("c", 2))
    outcome = decide(state, make_dra_pod(tp=2, annotations=NVLINK), ["pairs"])
    assert outcome.feasible == (("pairs",) if feasible else ()), outcome
    if not feasible:
        reason = outcome.failed["pairs"]
        assert "first-fit allocator would give it GPU 0 (island 0), GPU 2 (island 1)" in reason, reason
        assert "publishes no island attribute" in reason


def test_held_gpus_move_first_fit_and_the_group_follows():
    # Order 0,1,2,3: with GPU 1 held by another pod, first fit would take 0 and 2 (two pairs); with
    # GPUs 0 and 1 held it takes the pair 2,3.
    state = cluster(("pairs", "a100", [0, 1, 2, 3]))
    assert state.dra is not None
    feed = ClaimFeed(state.dra)
    feed.apply("ADDED", nvidia_claim("other", 1, allocated=[("pairs", "gpu-1")], reserved_for=["other"]))
    feed.apply("ADDED", nvidia_claim("c", 2))
    assert decide(state, make_dra_pod(tp=2, annotations=NVLINK), ["pairs"]).feasible == ()
    feed.apply("MODIFIED", nvidia_claim("other", 2, allocated=[("pairs", "gpu-0"), ("pairs", "gpu-1")],
                                        reserved_for=["other"]))
    assert decide(state, make_dra_pod(tp=2, annotations=NVLINK), ["pairs"]).feasible == ("pairs",)


def test_an_nvswitch_node_is_one_island_whatever_the_order():
    state = cluster(("h", "h100", [7, 3, 5, 1, 0, 2, 4, 6]))
    assert state.dra is not None
    ClaimFeed(state.dra).apply("ADDED", nvidia_claim("c", 4))
    assert decide(state, make_dra_pod(tp=4, annotations=NVLINK), ["h"]).feasible == ("h",)


def test_a_tp3_nvidia_claim_for_a_64_head_model_is_refused_in_vllms_words():
    state = cluster(("h", "h100", None))
    assert state.dra is not None
    ClaimFeed(state.dra).apply("ADDED", nvidia_claim("c", 3))
    outcome = decide(state, make_dra_pod(tp=3), ["h"])
    assert "must be divisible by tensor parallel size (3)" in outcome.unresolvable["h"]
    assert outcome.details["demand"]["dra"]["deviceClass"] == "gpu.nvidia.com"
